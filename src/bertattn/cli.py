"""The ``bertattn`` command. Thin: parses arguments, calls the public API, owns stdout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_article_demo

    demo = run_article_demo()
    print("The article's example: embed_dim=512, num_heads=8, batch_size=2, seq_len=10")
    print(f"input shape:            {demo.input_shape}")
    print(f"output shape:           {demo.output_shape}")
    print(f"attention weight shape: {demo.attention_shape}")
    for c in demo.checks:
        print(
            f"backend={c.requested:<6} ran={c.ran:<6} max|diff vs math|={c.max_abs_diff:.2e}  "
            f"({c.reason})"
        )
    return 0


def _encode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="text file (one text per line), .jsonl, or - for stdin")
    p.add_argument("-o", "--output", required=True, help="output .npy or .jsonl")
    p.add_argument("--model", default=None, help="model folder or hub name (default MiniLM)")
    p.add_argument("--field", default=None, help="JSON field holding the text (default text)")
    p.add_argument("--pooling", choices=("mean", "cls"), default=None)
    p.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalize the embeddings (default: as the model folder says)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=None, help="tokens (default: the model's)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _cmd_encode(args: argparse.Namespace) -> int:
    import signal
    import warnings

    from tqdm import tqdm

    from .bert.encode_job import encode_file

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        print(f"bertattn encode: warning: {message}", file=sys.stderr)

    def on_sigterm(signum, frame):  # type: ignore[no-untyped-def]
        raise SystemExit(128 + signum)  # unwinds: the temporary output file is removed

    bars: list[tqdm] = []

    def progress(total: int):  # type: ignore[no-untyped-def]
        bar = tqdm(total=total, unit="text", desc="encode", file=sys.stderr, disable=args.quiet)
        bars.append(bar)
        return bar.update

    signal.signal(signal.SIGTERM, on_sigterm)
    warnings.showwarning = show
    try:
        summary = encode_file(
            args.input,
            args.output,
            model=args.model,
            pooling=args.pooling,
            normalize=args.normalize,
            batch_size=args.batch_size,
            max_length=args.max_length,
            field=args.field,
            progress=progress,
        )
    except KeyboardInterrupt:
        print("bertattn encode: interrupted; no output written", file=sys.stderr)
        return 130
    finally:
        for bar in bars:
            bar.close()
    print(f"bertattn encode: {summary}", file=sys.stderr)
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "demo": ("run the article's example on every attention backend", _cmd_demo),
    "encode": ("embed every line of a text / .jsonl file into .npy or .jsonl", _cmd_encode),
}
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"encode": _encode_args}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertattn", description="BERT multi-head self-attention: correct, fast, visible."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in ARGUMENTS:
            ARGUMENTS[name](p)
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"bertattn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
