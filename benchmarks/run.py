"""`make bench`: every benchmark of issue 5 in one run, one JSON file, one printed table.

    python -m benchmarks.run [--only module,memory,padded,encode] [--repeats 5] [--json FILE]

Peers are interleaved round by round after warm-up; medians of >= 5 rounds; the thread count
and the machine are printed and stored with the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from bertattn.bench import environment
from bertattn.bench.memory import peak_memory
from bertattn.bench.module import format_module_table, run_module_bench


def _module(args: argparse.Namespace) -> tuple[object, str]:
    results = run_module_bench(repeats=args.repeats)
    return results, format_module_table(results)


def _memory(args: argparse.Namespace) -> tuple[object, str]:
    mib = peak_memory(8192)
    lines = ["peak RSS of one forward, B=1 L=8192 E=768 H=12 fp32 (fresh process each)"]
    for peer, value in mib.items():
        lines.append(f"  {peer:<10}{value:>9.0f} MiB")
    lines.append(
        f"  bertattn / article: {mib['bertattn'] / mib['article']:.3f}; above the baseline: "
        f"{(mib['bertattn'] - mib['baseline']):.0f} vs {(mib['article'] - mib['baseline']):.0f} MiB"
    )
    return mib, "\n".join(lines)


def _padded(args: argparse.Namespace) -> tuple[object, str]:
    from .padded import format_padded_table, run_padded_bench

    results = run_padded_bench(repeats=args.repeats)
    return results, format_padded_table(results)


def _encode(args: argparse.Namespace) -> tuple[object, str]:
    from .encode import format_encode_table, run_encode_bench

    result = run_encode_bench(repeats=args.repeats)
    return result, format_encode_table(result)


def _weights(args: argparse.Namespace) -> tuple[object, str]:
    from .weights_on_demand import format_weights_table, run_weights_bench

    result = run_weights_bench()
    return result, format_weights_table(result)


def _threshold(args: argparse.Namespace) -> tuple[object, str]:
    from .varlen_threshold import format_threshold_table, run_threshold_bench

    rows = run_threshold_bench(repeats=args.repeats)
    return rows, format_threshold_table(rows)


PARTS: dict[str, Callable[[argparse.Namespace], tuple[object, str]]] = {
    "module": _module,
    "memory": _memory,
    "padded": _padded,
    "encode": _encode,
    "weights": _weights,
    "threshold": _threshold,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default="bench-results.json")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in parts if s not in PARTS]
    if unknown:
        p.error(f"unknown part(s) {unknown}; valid: {', '.join(PARTS)}")
    env = environment()
    print(f"environment: {env}")
    results: dict[str, object] = {"environment": env}
    for name in parts:
        start = time.perf_counter()
        data, table = PARTS[name](args)
        results[name] = data
        print(f"\n== {name} ({time.perf_counter() - start:.0f} s)\n{table}", flush=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
