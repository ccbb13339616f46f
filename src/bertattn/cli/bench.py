"""`bertattn bench`: the module-level benchmark (the rest: `make bench`); `--dispatch`: the
attention dispatch policy table in use (`--measure`: re-measured on this machine, short)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per peer (default 5)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    p.add_argument("--cases", type=int, default=0, help="run only the first N cases")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument(
        "--dispatch",
        action="store_true",
        help="print the attention dispatch policy table `auto` uses, instead of timing",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="with --dispatch: re-measure the candidates here (quick, ~1 min) and print the "
        "table they give; the table in use is not changed (python -m benchmarks.dispatch "
        "regenerates it)",
    )


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    from ..bench import environment

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.measure and not args.dispatch:
        from ..errors import UsageError

        raise UsageError("--measure goes with --dispatch (bertattn bench --dispatch --measure)")
    if args.dispatch:
        return _dispatch(args)
    from ..bench.module import DEFAULT_CASES, format_module_table, run_module_bench

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


def _dispatch(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from ..attention import policy
    from ..bench import environment

    env = environment()
    print(f"environment: {env}")
    print("in use (src/bertattn/attention/policy.py):")
    print(policy.format_table())
    out: dict[str, object] = {
        "environment": env,
        "table": [dataclasses.asdict(r) for r in policy.TABLE],
    }
    if args.measure:
        from ..bench.dispatch import derive_table, format_measurement, measure

        m = measure(quick=True, repeats=max(3, min(args.repeats, 5)))
        print()
        print(format_measurement(m))
        table = derive_table(m)
        print()
        print("measured here (quick; not installed: python -m benchmarks.dispatch regenerates):")
        print(policy.format_table(table))
        out["measured"] = {
            "kernels": m.kernels,
            "varlen": m.varlen,
            "table": [dataclasses.asdict(r) for r in table],
        }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0
