"""scripts/upstream_st_plugin.py (the harness that counts sentence-transformers' own tests
passing through bertattn): the substitution reaches a test module's imports, the outcomes file
records each test, and the harness groups failures by reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SRC = Path(__file__).resolve().parents[1] / "src"

TOY = """
from sentence_transformers import CrossEncoder, MultiVectorEncoder, SparseEncoder
from sentence_transformers.sparse_encoder.model import SparseEncoder as Deep


def test_cross_encoder():
    assert CrossEncoder.__module__.startswith("bertattn.")


def test_sparse_encoder():
    assert SparseEncoder.__module__.startswith("bertattn.") and Deep is SparseEncoder


def test_multi_vector_encoder():
    assert MultiVectorEncoder.__module__.startswith("bertattn.")
"""


def _run(tmp_path: Path, substitute: bool) -> dict[str, dict[str, str]]:
    (tmp_path / "test_toy.py").write_text(TOY, encoding="utf-8")
    report = tmp_path / f"outcomes-{substitute}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(SRC)]),
        "BERTATTN_ST_SUBSTITUTE": "1" if substitute else "0",
        "BERTATTN_ST_REPORT": str(report),
        # the toy needs no installed plugin (hypothesis, xdist, anyio...): loading them took
        # ~3 s of CPU of each run's ~12; the plugin under test is named with -p below
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "upstream_st_plugin", "--rootdir", str(tmp_path), "-o", "addopts=",
            "test_toy.py"]  # fmt: skip
    subprocess.run(argv, cwd=tmp_path, env=env, check=False, capture_output=True, timeout=300)
    return json.loads(report.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_plugin_substitutes_the_three_classes_before_test_modules_import_them(tmp_path):
    plain = _run(tmp_path, substitute=False)
    ours = _run(tmp_path, substitute=True)
    names = [f"test_toy.py::test_{n}" for n in ("cross_encoder", "sparse_encoder",
                                                  "multi_vector_encoder")]  # fmt: skip
    assert {n: plain[n]["outcome"] for n in names} == dict.fromkeys(names, "failed")
    assert "AssertionError" in plain[names[0]]["error"]
    assert {n: ours[n]["outcome"] for n in names} == dict.fromkeys(names, "passed")


def test_failures_are_grouped_by_reason():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from upstream_st_tests import reason, summary
    finally:
        sys.path.remove(str(SCRIPTS))
    assert reason("tests/cross_encoder/losses/test_misc.py::test_a", "x") == "training"
    assert reason("tests/x/test_model.py::t", "TypeError: 'M' object is not subscriptable") == (
        "module internals"
    )
    assert reason("tests/x/test_model.py::t", "ValueError: bad") == "other"
    plain = {
        "tests/cross_encoder/test_model.py::a": {"outcome": "passed", "error": ""},
        "tests/cross_encoder/test_model.py::b": {"outcome": "passed", "error": ""},
        "tests/cross_encoder/test_model.py::c": {"outcome": "failed", "error": "E"},
    }
    ours = {
        "tests/cross_encoder/test_model.py::a": {"outcome": "passed", "error": ""},
        "tests/cross_encoder/test_model.py::c": {"outcome": "passed", "error": ""},
    }
    got = summary(plain, ours)["cross_encoder"]
    assert (got["passed_upstream"], got["passed_bertattn"]) == (2, 1)
    assert got["left"] == {"other": {"not collected  [tests/cross_encoder/test_model.py]": 1}}
