"""``--workers N``: run the same command as N ranks on this machine through torchrun.

Runs torchrun's launcher in this process, as ``torchrun --standalone --nproc-per-node N -m
bertattn ARGS`` would (a local rendezvous on a free loopback port): it stops the other ranks when
one fails. Unless ``OMP_NUM_THREADS`` is set, each rank gets the CPU cores divided by N.
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
    threads = "OMP_NUM_THREADS" not in os.environ
    if threads:  # the cores shared out (torchrun would give each rank 1, with a banner)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nprocs))
    # torchrun's own log lines (rendezvous, "death signal", the failure report) repeat what the
    # ranks and this job say; its loggers set their own levels, so each is quieted
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed")
    ] + [logging.getLogger("torch.distributed.elastic")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        run(parse_args(cmd[3:]))
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        return next((c if c > 0 else 128 - c for c in codes if c), 1)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
        os.environ["PYTHONPATH"] = path
        if not path:
            del os.environ["PYTHONPATH"]
        if threads:
            del os.environ["OMP_NUM_THREADS"]
    return 0
