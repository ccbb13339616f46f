"""`bertattn bench`: the module-level benchmark (the rest: `make bench`)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per peer (default 5)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--cases", type=int, default=0, help="run only the first N cases")
    p.add_argument("--json", help="also write the results to this JSON file")


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from ..bench import environment
    from ..bench.module import DEFAULT_CASES, format_module_table, run_module_bench

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
