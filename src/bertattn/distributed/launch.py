"""``--workers N``: run the same command as N ranks on this machine through torchrun.

Runs torchrun's launcher in this process, as ``torchrun --standalone --nproc-per-node N -m
bertattn ARGS`` would (a local rendezvous on a free loopback port): it stops the other ranks when
one fails. torchrun sets ``OMP_NUM_THREADS=1`` per rank unless it is already set.
"""

from __future__ import annotations

import logging
import os
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
    """Run ``bertattn ARGV`` as ``nprocs`` ranks; return the exit status (0, the first failed
    rank's status, or 128 + N when this process got signal N).

    torchrun's launcher runs inside this process (``torch.distributed.run.run``), so its
    failure report (``ChildFailedError`` and its traceback) is turned into a status here: the
    caller says what failed, in one line. SIGINT / SIGTERM / SIGHUP reach the launcher, which
    stops the ranks.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    cmd = torchrun_command(nprocs, argv)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the bertattn package
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, path) if p)
    quiet = logging.getLogger("torch.distributed.elastic")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its INFO/ERROR lines repeat what the ranks report
    try:
        run(parse_args(cmd[3:]))
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        return next((c if c > 0 else 128 - c for c in codes if c), 1)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    finally:
        quiet.setLevel(level)
        os.environ["PYTHONPATH"] = path
        if not path:
            del os.environ["PYTHONPATH"]
    return 0
