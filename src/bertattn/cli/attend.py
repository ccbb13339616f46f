"""`bertattn attend`: one text in, its attention out (options: `bertattn.jobs.AttendOptions`)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..jobs.attend_options import AttendOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.attend_options import AttendOptions
    from ..jobs.fields import add_arguments

    add_arguments(p, AttendOptions)
    p.add_argument(
        "--lang",
        choices=("zh", "en"),
        default=None,
        help="the language of --explain's steps: zh (中文) or en (default: zh when the locale, "
        "LC_ALL / LC_MESSAGES / LANG, starts with zh, else en)",
    )


def run(args: argparse.Namespace) -> int:
    """Data (the summary, the steps, ``--json -`` / ``--html -``) on stdout; status lines
    (what was written, warnings) on stderr, unless ``-q``."""
    from .. import viz
    from ..jobs.attend import run_attend
    from ..jobs.attend_options import AttendOptions
    from ..jobs.fields import from_namespace

    options = from_namespace(AttendOptions, args)
    lang = _lang(options, getattr(args, "lang", None))
    _check_stdout(options)
    result = run_attend(options)
    maps = result.maps
    for message in result.warnings:  # e.g. "1 text truncated to 256 tokens": reported
        print(f"bertattn attend: warning: {message}", file=sys.stderr)
    if not options.quiet:  # how the options were read, e.g. which of two equal tokens
        for message in result.notes:
            print(f"bertattn attend: warning: {message}", file=sys.stderr)
    if result.steps is not None:
        print(result.steps.table(lang))
        print()
        print(result.steps.formula(lang))
    if result.stdout is not None:
        from ..files import write_stdout

        write_stdout(result.stdout)
    elif not options.outputs and result.steps is None:
        print(viz.summary(maps, layer=options.layer or 0, head=options.head or 0))
        if result.prediction is not None:
            print(f"\nthe model's head decided: {result.prediction}")
        if options.rollout:
            roll = viz.attention_rollout(maps)
            print("\nrollout: most attended input token per token")
            for i, tok in enumerate(maps.tokens):
                j = int(roll[i].argmax())
                print(f"  {i:>4} {tok:<16} -> {maps.tokens[j]} ({roll[i, j]:.3f})")
    if result.written and not options.quiet:
        print(
            f"bertattn attend: {len(maps.tokens)} tokens, {maps.num_layers} layers x "
            f"{maps.num_heads} heads ({maps.model_name})",
            file=sys.stderr,
        )
        for path in result.written:
            print(f"bertattn attend: wrote {path.resolve()}", file=sys.stderr)
    sys.stdout.flush()  # a closed stdout fails here, inside main (exit 141), not at exit
    return 0


def _check_stdout(options: AttendOptions) -> None:
    """Refuse, before any work, a run that writes to stdout when the command was started
    without one (``>&-``): the summary (no file asked for), ``--explain``'s steps, ``-``."""
    from ..errors import UsageError
    from ..stdio import is_closed

    dash = "-" in (options.html, options.json)
    if (not options.outputs or options.explain is not None or dash) and is_closed(sys.stdout):
        raise UsageError(
            "stdout is closed (the command was started with >&-), and attend writes its "
            "summary, --explain steps or '-' output there; run it with a stdout, or ask for "
            "files only (--png/--html/--json FILE)."
        )


def _lang(options: AttendOptions, given: str | None) -> str:
    """``--explain``'s language: ``--lang``, else the locale's; ``--lang`` without ``--explain``
    is refused (nothing else attend prints is in words)."""
    from ..errors import UsageError
    from ..viz.words import lang_from_env

    if given is not None and options.explain is None:
        raise UsageError(
            f"--lang {given} chooses the language of --explain's steps, and there is no "
            f"--explain; add --explain LAYER:HEAD:TOKEN, or drop --lang."
        )
    return given or lang_from_env()
