"""``python -m bertattn demo``: the article's example, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import bertattn

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_shapes_and_every_backend() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "bertattn", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"input shape:\s+\(2, 10, 512\)", out)
    assert re.search(r"output shape:\s+\(2, 10, 512\)", out)
    assert re.search(r"attention weight shape:\s+\(2, 8, 10, 10\)", out)
    rows = re.findall(r"backend=(\S+)\s+ran=(\S+)\s+max\|diff vs math\|=(\S+)", out)
    assert {r[0] for r in rows} == {*bertattn.BACKENDS, "auto"}
    assert len(rows) == len(bertattn.BACKENDS) + 1
    for requested, ran, diff in rows:
        assert ran == ("sdpa" if requested == "auto" else requested)
        assert float(diff) < 1e-5, (requested, diff)
    assert proc.stderr == ""
