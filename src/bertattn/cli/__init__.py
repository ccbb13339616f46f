"""The ``bertattn`` command. Thin: parses arguments into a job's options, runs the job, reports.

One module per subcommand, each with ``add_arguments(parser)`` and ``run(args) -> int``.

The one error policy, for every subcommand (:func:`main`):

====  ==========================================================================================
exit  when
====  ==========================================================================================
0     done
1     a runtime error: a malformed input or model folder, a failed rank, a missing optional
      package (the message names the ``pip install``), a file that cannot be written
2     a usage error: argparse's, or options that cannot work (a range, a combination, an output
      that is the input or a folder, a folder that cannot be written) — found before any work
130   interrupted (Ctrl-C) at any moment; 128 + N for signal N (SIGTERM: 143), except that
      ``serve`` drains on SIGTERM and exits 0 (1 when the drain timed out)
141   stdout was closed early (``| head``): the command stops quietly
====  ==========================================================================================

Anticipated errors are one line on stderr, ``bertattn COMMAND: error: ...``; ``--debug`` (or
``BERTATTN_DEBUG=1``) shows their tracebacks. Anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence

from ..errors import exit_status, one_line
from ..stdio import NamedStdout, is_closed, mend_closed_streams

#: subcommand -> one-line help; the code is in ``bertattn/cli/<name>.py``.
COMMANDS: dict[str, str] = {
    "demo": "run the article's example on every attention backend",
    "attend": "show one text's attention: summary, PNG, interactive HTML page, JSON",
    "encode": "embed every line of a text / .jsonl file into .npy or .jsonl",
    "bench": "time MultiHeadAttention against its peers (module level)",
    "export-onnx": "export a BERT model to ONNX (dynamic batch and length) for ONNX Runtime",
    "serve": "serve sentence embeddings over HTTP (OpenAI /v1/embeddings, TEI /embed)",
    "rerank": "rank the documents of a file for a query with a cross-encoder (JSON lines)",
    "predict": "classify, tag or fill in every line with the model's head (JSON lines)",
    "get-model": "make a model folder locally (multilingual-e5-small: Chinese) and print its path",
}

EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 1, 2, 130, 141


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="bertattn", description="BERT multi-head self-attention: correct, fast, visible."
    )
    parser.add_argument("--version", action="version", version=f"bertattn {__version__}")
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the traceback of an error (also: BERTATTN_DEBUG=1)",
    )
    debug.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log what bertattn does on stderr (-vv: also which attention kernel ran, per call)",
    )
    for action in debug._actions:  # also before the subcommand
        parser._add_action(action)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[debug])
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    parser.set_defaults(subparsers=sub.choices)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, but an argument no option takes is reported by the subcommand's
    parser (its usage, ``bertattn COMMAND: error:``), and a second input path of ``encode`` (a
    shell glob that expanded) says to quote the glob."""
    args, extras = parser.parse_known_args(argv)
    if not extras:
        return args
    command = args.subparsers[args.command]
    paths = [e for e in extras if not e.startswith("-")]
    if args.command == "encode" and paths and len(paths) == len(extras):
        command.error(
            f"encode takes one INPUT, got {len(paths) + 1} paths ({args.input}, "
            f"{', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}): a shell glob expands "
            f"into every file it matches; quote it ('corpus/*.txt'), or give the folder."
        )
    command.error(f"unrecognized arguments: {' '.join(extras)}")
    return args  # not reached: error() exits


def _prefix(command: str) -> str:
    """``bertattn COMMAND:``, with the rank under torchrun."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "1")
    who = f" rank {rank}:" if rank and world not in ("", "1") else ""
    return f"bertattn {command}:{who}"


def _log_to_stderr(verbose: int, prefix: str) -> None:
    """``-v``: bertattn's INFO log lines on stderr; ``-vv``: DEBUG too (one line per attention
    call from ``bertattn.dispatch``)."""
    if not verbose:
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix} %(name)s: %(message)s"))
    log = logging.getLogger("bertattn")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


def _on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: temporary files are removed on the way


class _HeldInterrupts:
    """Ctrl-C held back during start-up (parsing the arguments, importing numpy and torch) and
    honoured as soon as it is over (:meth:`release`). A KeyboardInterrupt raised inside an
    extension's import (numpy's, or torch's Python callbacks run from C++) can abort the process
    (``pybind11::error_already_set``), come out as an ImportError, or leave the process to die by
    SIGINT after ``main`` returned."""

    def __init__(self) -> None:
        self.pressed: list[int] = []
        self.previous = signal.signal(signal.SIGINT, lambda signum, frame: self.pressed.append(1))

    def release(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None
        if self.pressed:
            self.pressed.clear()
            raise KeyboardInterrupt


def _start_up(argv: list[str]) -> argparse.Namespace:
    args = _parse(build_parser(), argv)  # imports the jobs' options (numpy)
    import numpy  # noqa: F401
    import torch  # noqa: F401  (every command needs it)

    return args


def _interrupt_again(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _unraisable(unraisable: object) -> None:
    """A Ctrl-C that lands inside a callback Python runs for itself (a weakref callback of the
    import machinery, while torch loads) is printed and dropped by Python; deliver it again a
    moment later, where it interrupts the command."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    sys.__unraisablehook__(unraisable)  # type: ignore[arg-type]


def _above_bars(line: str) -> None:
    """``line`` on stderr; while a progress bar is drawn there, above it (the bar is cleared
    and drawn again), not into the bar's own line."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None and getattr(tqdm.tqdm, "_instances", None):
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the exit status (see the module docstring)."""
    held = _HeldInterrupts()  # first: no Ctrl-C can land before the handlers below
    mend_closed_streams()  # started with <&- / >&- / 2>&-: errors in one line, not tracebacks
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if a in COMMANDS), "")
    prefix = _prefix(command) if command else "bertattn:"
    debug = "--debug" in argv or os.environ.get("BERTATTN_DEBUG", "") not in ("", "0")
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGALRM, _interrupt_again)
    unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        _above_bars(f"{prefix} warning: {message}")

    shown = warnings.showwarning
    warnings.showwarning = show
    try:
        try:
            args = _start_up(argv)
        except SystemExit as exc:  # --help, --version, or a parse error (already printed)
            held.release()
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        held.release()
        _log_to_stderr(getattr(args, "verbose", 0), prefix)
        return _run_named_stdout(args)
    except KeyboardInterrupt:
        print(f"{prefix} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # SIGTERM / SIGHUP turned into SystemExit(128 + N) on the way out
        if isinstance(exc.code, int) and exc.code > 128:
            signum = exc.code - 128
            print(f"{prefix} stopped by signal {signum}; no output written", file=sys.stderr)
        raise
    except BrokenPipeError:  # stdout closed early (| head): stop quietly, as Unix tools do
        _stdout_to_null()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if _caused_by_interrupt(exc):  # e.g. a C extension's init stopped by Ctrl-C
            print(f"{prefix} interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if isinstance(exc, OSError) and exc.filename == "<stdout>":
            _stdout_to_null()  # what is still buffered for it must not fail again at exit
        code = exit_status(exc)
        if code is None or debug:
            traceback.print_exc()
        if code is None:
            return EXIT_RUNTIME
        print(f"{prefix} error: {one_line(exc)}", file=sys.stderr)
        return code
    finally:
        if held.previous is not None:  # an error during start-up: put Ctrl-C back as it was
            signal.signal(signal.SIGINT, held.previous)
        warnings.showwarning = shown
        sys.unraisablehook = unraisable
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGALRM, previous[1])


def _run_named_stdout(args: argparse.Namespace) -> int:
    """The command, with ``sys.stdout`` naming itself in its errors (a full disk behind
    ``> file``: ``<stdout>: No space left on device``) and flushed before the end, so that its
    last bytes fail here, in one line, not in the interpreter's exit."""
    stdout = sys.stdout
    if not is_closed(stdout):
        sys.stdout = NamedStdout(stdout)  # type: ignore[assignment]
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    finally:
        sys.stdout = stdout


def job_command(command: str) -> tuple[Callable[..., None], Callable[..., int]]:
    """``(add_arguments, run)`` of a command whose options are ``<Name>Options`` in
    :mod:`bertattn.jobs.head_options` and whose job is ``run_<name>`` in :mod:`bertattn.jobs.heads`
    (``rerank``, ``predict``): the job's summary goes on stderr (``bertattn COMMAND:
    SUMMARY``) unless ``-q``."""
    name = command.replace("-", "_")

    def options_class() -> type:
        from ..jobs import head_options

        return getattr(head_options, f"{name.title().replace('_', '')}Options")

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        from ..jobs.fields import add_arguments

        add_arguments(parser, options_class())

    def run(args: argparse.Namespace) -> int:
        from ..jobs import heads
        from ..jobs.fields import from_namespace

        options = from_namespace(options_class(), args)
        summary = getattr(heads, f"run_{name}")(options)
        if summary is not None and not options.quiet:
            print(f"bertattn {command}: {summary}", file=sys.stderr)
        return 0

    return add_arguments, run


def _stdout_to_null() -> None:
    """Put ``/dev/null`` on stdout's descriptor: stdout failed (closed pipe, full disk), and
    the bytes still buffered for it are dropped at exit instead of failing once more."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a descriptor (a test's in-memory stream)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _caused_by_interrupt(exc: BaseException) -> bool:
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 20:
        if isinstance(cause, KeyboardInterrupt):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def console() -> None:
    """The ``bertattn`` executable: :func:`main`, then exit with its status.

    After Ctrl-C the process leaves without finalizing the interpreter (outputs are already
    whole or removed, streams are flushed): a KeyboardInterrupt that went through Python code
    run from C (torch, pybind11) marks it unhandled inside CPython even when caught, and a normal
    exit would then turn 130 into death by SIGINT.
    """
    code = main()
    if code == EXIT_INTERRUPTED:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
