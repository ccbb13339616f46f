"""The ``bertattn`` command. Thin: parses arguments, calls the public API, owns stdout.

One module per subcommand, each with ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> one-line help; the code is in ``bertattn/cli/<name>.py``.
COMMANDS: dict[str, str] = {
    "demo": "run the article's example on every attention backend",
    "attend": "show one text's attention: summary, PNG, interactive HTML page, JSON",
    "encode": "embed every line of a text / .jsonl file into .npy or .jsonl",
    "bench": "time MultiHeadAttention against its peers (module level)",
    "export-onnx": "export a BERT model to ONNX (dynamic batch and length) for ONNX Runtime",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertattn", description="BERT multi-head self-attention: correct, fast, visible."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, OSError) as exc:
        print(f"bertattn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
