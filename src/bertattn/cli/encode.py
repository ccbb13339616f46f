"""`bertattn encode`: embed every line of a file (options: :class:`bertattn.jobs.EncodeOptions`)."""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.encode_options import EncodeOptions
    from ..jobs.fields import add_arguments

    add_arguments(p, EncodeOptions)


def show_progress(*, forced: bool, quiet: bool) -> bool:
    """A progress bar on stderr: never with ``-q`` or ``TQDM_DISABLE`` set (tqdm's own switch);
    else on a terminal, or anywhere with ``--progress`` (a log file gets no bar by default)."""
    if quiet or os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false"):
        return False
    return forced or sys.stderr.isatty()


def run(args: argparse.Namespace) -> int:
    import logging

    from ..jobs.encode import run_encode
    from ..jobs.encode_options import EncodeOptions
    from ..jobs.fields import from_namespace

    options = from_namespace(EncodeOptions, args)
    bars: list = []

    def progress(total: int, unit: str = "text"):  # type: ignore[no-untyped-def]
        from tqdm import tqdm

        show = show_progress(forced=options.progress, quiet=options.quiet)
        bar = tqdm(
            total=total,
            unit=unit,
            unit_scale=unit in ("B", "token"),
            desc="encode",
            file=sys.stderr,
            disable=not show,
        )
        bars.append(bar)
        return bar.update

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("bertattn encode: %(message)s"))
    log = logging.getLogger("bertattn.distributed")
    log.addHandler(handler)
    log.setLevel(logging.WARNING if options.quiet else logging.INFO)
    propagate, log.propagate = log.propagate, False  # -v's handler would print it again
    keep = str(options.output) if options.sharded else f"{options.output}.parts"
    try:
        summary = run_encode(options, progress=progress)
    except (KeyboardInterrupt, SystemExit):
        rank = os.environ.get("RANK", "0") or "0"
        if (options.chunked or options.workers is not None) and rank == "0":
            print(
                f"bertattn encode: no output written; finished chunks are kept in {keep}: rerun "
                f"the same command to resume",
                file=sys.stderr,
            )
        raise
    finally:
        for bar in bars:
            bar.close()
        log.removeHandler(handler)
        log.propagate = propagate
    if summary is not None and not options.quiet:
        print(f"bertattn encode: {summary}", file=sys.stderr)
    return 0
