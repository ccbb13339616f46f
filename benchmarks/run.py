"""`make bench`: every benchmark in one run, one JSON file, one printed table.

    python -m benchmarks.run [--only module,overhead,memory,padded,encode,weights,threshold]
                             [--repeats 5] [--threads N] [--json FILE]

Peers are interleaved round by round after warm-up; medians of >= 5 rounds; the thread count
and the machine (with its CPU capability: AVX2 / AVX512 / AVX512_BF16 / AMX) are printed and
stored with the numbers. The parts with speed targets (module, overhead, encode) end with each
target and its verdict: met, not met, or not measurable here (bf16 targets on a CPU that
emulates bf16). The GPU targets are in ``python -m benchmarks.gpu``.
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

#: the module-level targets: (dtype, peer, bertattn must be at least this many times faster)
MODULE_TARGETS = (
    ("float32", "hf_sdpa", 1.0),
    ("bfloat16", "article", 1.15),
    ("bfloat16", "torch_mha", 1.1),
)


def module_targets(results: list[dict], bf16_matmul: str) -> list[dict[str, object]]:
    """Each module target judged on every case of its dtype (the worst case decides).
    bf16 targets are "not measurable here" when the CPU emulates bf16 (``bf16_matmul``)."""
    rows: list[dict[str, object]] = []
    for dtype, peer, need in MODULE_TARGETS:
        cases = [r for r in results if r["dtype"] == dtype and peer in r["speedup_vs"]]
        ratios = {f"B={r['batch']} L={r['seq_len']}": r["speedup_vs"][peer] for r in cases}
        if not ratios:
            status = "not measured (no case or peer in this run)"
        elif dtype != "float32" and bf16_matmul != "native":
            status = "not measurable here (bf16 emulated)"
        else:
            status = "met" if min(ratios.values()) >= need else "not met"
        rows.append(
            {"dtype": dtype, "peer": peer, "need": need, "ratios": ratios, "status": status}
        )
    return rows


def format_module_targets(rows: list[dict[str, object]]) -> str:
    lines = ["targets (bertattn x = the peer's time / bertattn's, at every case):"]
    for t in rows:
        ratios = ", ".join(f"{case} {r:.2f}x" for case, r in t["ratios"].items())  # type: ignore[attr-defined]
        lines.append(
            f"  {t['dtype']} vs {t['peer']} >= {t['need']}x: {ratios or '-'}: {t['status']}"
        )
    return "\n".join(lines)


def _module(args: argparse.Namespace) -> tuple[object, str]:
    results = run_module_bench(repeats=args.repeats)
    targets = module_targets(results, str(environment()["bf16_matmul"]))
    table = format_module_table(results) + "\n" + format_module_targets(targets)
    return {"cases": results, "targets": targets}, table


def _overhead(args: argparse.Namespace) -> tuple[object, str]:
    from .overhead import format_results, minilm_case, targets, tiny_cases

    results = {**tiny_cases(max(args.repeats, 15)), **minilm_case(max(args.repeats, 15))}
    return {"seconds": results, "targets": targets(results)}, format_results(
        results, environment()
    )


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
    "overhead": _overhead,
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
