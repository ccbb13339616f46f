"""``--workers N``: run the same command as N ranks on this machine through torchrun.

Spawns ``python -m torch.distributed.run --standalone --nproc-per-node N -m bertattn ARGS``
(a local rendezvous on a free loopback port) and returns its exit status: torchrun stops the
other ranks when one fails and exits non-zero. SIGTERM to this process is passed on to
torchrun, which passes it to the ranks. torchrun sets ``OMP_NUM_THREADS=1`` per rank unless
it is already set.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["launch_workers", "torchrun_command"]


def torchrun_command(nprocs: int, argv: Sequence[str]) -> list[str]:
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"the number of workers must be a positive int, got {nprocs!r}.")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nprocs}",
        "-m",
        "bertattn",
        *argv,
    ]


def launch_workers(nprocs: int, argv: Sequence[str]) -> int:
    """Run ``bertattn ARGV`` as ``nprocs`` ranks; the exit status (128 + N for signal N)."""
    cmd = torchrun_command(nprocs, argv)
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the bertattn package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum, frame):  # type: ignore[no-untyped-def]
        proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # the ranks got the SIGINT too (same process group)
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code
