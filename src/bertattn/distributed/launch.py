"""``--workers N``: run the same command as N ranks on this machine through torchrun.

Runs torchrun's launcher in this process, as ``torchrun --standalone --nproc-per-node N -m
bertattn ARGS`` would (a local rendezvous on a free loopback port): it stops the other ranks when
one fails. Unless ``OMP_NUM_THREADS`` is set, each rank gets the usable CPUs (affinity, capped
by a cgroup CPU quota: :func:`bertattn.runtime.threads.cpu_budget`) divided by N.

The launching process reports a failure once, for all ranks: each rank that stops on an error
writes it to the report folder named by ``BERTATTN_WORKERS_REPORT`` (:func:`write_report`) and
exits without printing it; the launcher reads them (:func:`read_reports`) and says the cause.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "REPORT_ENV",
    "WorkersResult",
    "launch_workers",
    "read_reports",
    "run_workers",
    "signal_name",
    "torchrun_command",
    "write_report",
]

#: the folder where the ranks of ``--workers`` leave their errors for the launcher
REPORT_ENV = "BERTATTN_WORKERS_REPORT"


def write_report(folder: str | Path, rank: int, report: dict) -> None:
    """Leave this rank's error (``message``, ``code``, ``echo``: it repeats another rank's)."""
    from ..files import write_atomic

    write_atomic(Path(folder) / f"rank{rank}.json", json.dumps({"rank": rank, **report}).encode())


def read_reports(folder: str | Path) -> list[dict]:
    """The ranks' reports, by rank."""
    out = []
    for p in Path(folder).glob("rank*.json"):
        try:
            report = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            out.append(report)
    return sorted(out, key=lambda r: int(r.get("rank", 0)))


def wait_for_reports(folder: str | Path, world_size: int, seconds: float) -> None:
    """Until every rank has reported or ``seconds`` have passed: a rank that failed first
    gives the others a moment to see it and stop by themselves (rather than be killed by the
    launcher mid-chunk)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(list(Path(folder).glob("rank*.json"))) >= world_size:
            return
        time.sleep(0.05)


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


@dataclass(frozen=True)
class WorkersResult:
    """How a ``--workers`` run ended: ``code`` (0, the first failed rank's status, or 128 + N),
    ``rank`` (the first rank that failed, None when none did or this process was stopped),
    ``signal`` (the signal that ended that rank, or this process when ``rank`` is None)."""

    code: int
    rank: int | None = None
    signal: int | None = None


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal N`` for a number the system does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def launch_workers(nprocs: int, argv: Sequence[str], *, report: str | Path | None = None) -> int:
    """Run ``bertattn ARGV`` as ``nprocs`` ranks; return the exit status (0, the first failed
    rank's status, or 128 + N when this process got signal N). ``report``: a folder where the
    ranks leave their errors (see :func:`read_reports`) instead of printing them.
    :func:`run_workers` also says which rank failed, and by which signal."""
    return run_workers(nprocs, argv, report=report).code


def run_workers(
    nprocs: int, argv: Sequence[str], *, report: str | Path | None = None
) -> WorkersResult:
    """Run ``bertattn ARGV`` as ``nprocs`` ranks (see :func:`launch_workers`): how it ended.

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
    if report is not None:
        os.environ[REPORT_ENV] = str(report)
    if threads:  # the usable CPUs shared out (torchrun would give each rank 1, with a banner)
        from ..runtime.threads import cpu_budget, split_threads

        os.environ["OMP_NUM_THREADS"] = str(split_threads(cpu_budget().cpus, nprocs))
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
        first, failure = exc.get_first_failure()  # the earliest: the others followed it
        code = failure.exitcode
        if code < 0:  # ended by a signal (torchrun's exit code is minus its number)
            return WorkersResult(128 - code, first, -code)
        return WorkersResult(code or 1, first)
    except SignalException as exc:
        return WorkersResult(128 + int(exc.sigval), None, int(exc.sigval))
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
        os.environ["PYTHONPATH"] = path
        if not path:
            del os.environ["PYTHONPATH"]
        if threads:
            del os.environ["OMP_NUM_THREADS"]
        if report is not None:
            os.environ.pop(REPORT_ENV, None)
    return WorkersResult(0)
