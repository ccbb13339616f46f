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


def _cmd_bench(args: argparse.Namespace) -> int:
    import json

    import torch

    from .bench import environment
    from .bench.module import DEFAULT_CASES, format_module_table, run_module_bench

    if args.threads:
        torch.set_num_threads(args.threads)
    cases = DEFAULT_CASES[: args.cases] if args.cases else DEFAULT_CASES
    env = environment()
    print(f"module benchmark: E=768 H=12, eval, need_weights=False; {env}")
    results = run_module_bench(cases, repeats=args.repeats)
    print(format_module_table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"environment": env, "module": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "demo": ("run the article's example on every attention backend", _cmd_demo),
    "bench": ("time MultiHeadAttention against its peers (module level)", _cmd_bench),
}


def _add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per peer (default 5)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--cases", type=int, default=0, help="run only the first N cases")
    p.add_argument("--json", help="also write the results to this JSON file")


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {"bench": _add_bench_args}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertattn", description="BERT multi-head self-attention: correct, fast, visible."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, func) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if name in ARGUMENTS:
            ARGUMENTS[name](p)
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
