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


def run(args: argparse.Namespace) -> int:
    from ..jobs.fields import from_namespace
    from ..jobs.serve import run_serve
    from ..jobs.serve_options import ServeOptions

    options = from_namespace(ServeOptions, args)

    def announce(line: str) -> None:
        if not options.quiet:
            print(f"bertattn serve: {line}", file=sys.stderr, flush=True)

    result = run_serve(options, announce=announce)
    if result.signal == signal.SIGINT:
        return 130
    return 0 if result.drained else 1
