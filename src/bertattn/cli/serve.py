"""`bertattn serve`: sentence embeddings over HTTP (options: :class:`bertattn.jobs.ServeOptions`).

Exit 0 after SIGTERM (drained), 130 after Ctrl-C; a missing ``bertattn[serve]``, a port in use
or a bad model: one line, exit 1 (2 for options that cannot work and a model path that is not
a model folder, found before the model loads)."""

from __future__ import annotations

import argparse
import signal
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.fields import add_arguments
    from ..jobs.serve_options import ServeOptions

    add_arguments(p, ServeOptions)
    p.add_argument(
        "--access-log",
        action="store_true",
        help="a line per request on stderr: client, method and path, status, tokens, time "
        "(-v shows them too, with the rest of the log)",
    )


def run(args: argparse.Namespace) -> int:
    from ..jobs.fields import from_namespace
    from ..jobs.serve import run_serve
    from ..jobs.serve_options import ServeOptions

    options = from_namespace(ServeOptions, args)

    def announce(line: str) -> None:
        if not options.quiet:
            print(f"bertattn serve: {line}", file=sys.stderr, flush=True)

    if getattr(args, "access_log", False):
        _show_access_log()
    result = run_serve(options, announce=announce)
    if result.signal == signal.SIGINT:
        return 130
    return 0 if result.drained else 1


def _show_access_log() -> None:
    """The access log's lines on stderr (``bertattn serve: access: ...``), without ``-v``."""
    import logging

    from ..serve.access_log import LOGGER

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("bertattn serve: access: %(message)s"))
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # -v's handler on bertattn would print each line again
