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


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "demo": ("run the article's example on every attention backend", _cmd_demo),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertattn", description="BERT multi-head self-attention: correct, fast, visible."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
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
