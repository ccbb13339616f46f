"""MKL-packed GEMM weights (``BertModel.prepack``) against plain ``F.linear``, by row count.

    python -m benchmarks.prepack [--rows 1,5,9,...] [--repeats 15] [--threads N] [--back-to-back]

The 25 per-token linear layers of all-MiniLM-L6-v2 (its own weights, from
``default_model_dir()``; not the pooler, which sees one row per text), run in sequence on
random inputs of M rows, fp32, ``torch.inference_mode()``: plain ``F.linear`` against
``bertattn.attention.prepack.linear`` with every weight packed for exactly M rows.
Interleaved round by round (each round then starts with the other peer's weights in the
caches) or, with ``--back-to-back``, all plain rounds and then all packed ones (warm caches, as
in a service running one model); medians of loops; prints the CPU's capabilities and, per M,
both times and the ratio. What it shows: where packing pays (small M, where MKL's per-call
weight re-layout is a large share of the product) and where it stops paying.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from bertattn.attention import prepack as pp
from bertattn.bench import environment, interleaved_medians

from .overhead import gemm_weights


def run(rows: list[int], repeats: int, back_to_back: bool = False) -> list[dict[str, float]]:
    from bertattn import BertModel
    from bertattn.encoder.pipeline import default_model_dir

    model = BertModel.from_pretrained(default_model_dir()).eval()
    results = []
    with torch.inference_mode():  # qkv_weight() is the fused storage itself only without autograd
        gemms = [(w, b) for w, b, per_token in gemm_weights(model) if per_token]
        for m in rows:
            xs = [torch.randn(m, w.shape[1]) for w, _ in gemms]
            model.prepack([m])

            def plain(xs: list[torch.Tensor] = xs) -> None:
                for _ in range(10):
                    for x, (w, b) in zip(xs, gemms, strict=True):
                        F.linear(x, w, b)

            def packed(xs: list[torch.Tensor] = xs) -> None:
                for _ in range(10):
                    for x, (w, b) in zip(xs, gemms, strict=True):
                        pp.linear(x, w, b)

            if pp.packed_counts(model) != (m,) or any(pp._packs_of(w) is None for w, _ in gemms):
                raise RuntimeError("a GEMM weight of the benchmark has no pack: fix the benchmark")
            for x, (w, b) in zip(xs, gemms, strict=True):  # same values, to float32 rounding
                torch.testing.assert_close(pp.linear(x, w, b), F.linear(x, w, b))
            fns = {"plain": plain, "packed": packed}
            if back_to_back:  # all plain rounds, then all packed ones: each with warm caches
                samples = {
                    k: interleaved_medians({k: f}, repeats=repeats, warmup=2).samples[k]
                    for k, f in fns.items()
                }
            else:
                samples = interleaved_medians(fns, repeats=repeats, warmup=2).samples
            med = {k: sorted(v)[len(v) // 2] / 10 for k, v in samples.items()}
            results.append({"rows": m, "plain_s": med["plain"], "packed_s": med["packed"]})
            model.prepack([])
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="MKL-packed GEMM weights vs F.linear by row count")
    ap.add_argument("--rows", default="1,5,9,12,16,20,32,64", help="row counts (comma-separated)")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds (default 15)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument(
        "--back-to-back",
        action="store_true",
        help="time all plain rounds, then all packed ones (warm caches, as in a service that "
        "runs one model), instead of interleaving them round by round",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not pp.available():
        print("this torch build has no MKL packed GEMM: nothing to measure")
        return 0
    rows = [int(r) for r in args.rows.split(",") if r.strip()]
    env = environment()
    print(
        f"the 25 MiniLM GEMMs in sequence, fp32, inference_mode; threads={env['threads']}, "
        f"cpu_capability={env['cpu_capability']}, "
        + ("back to back" if args.back_to_back else "interleaved round by round")
    )
    print(f"{'rows':>5}{'plain ms':>10}{'packed ms':>11}{'packed / plain':>16}")
    for r in run(rows, args.repeats, args.back_to_back):
        ratio = r["packed_s"] / r["plain_s"]
        plain, packed = r["plain_s"] * 1e3, r["packed_s"] * 1e3
        print(f"{r['rows']:>5}{plain:>10.2f}{packed:>11.2f}{ratio:>15.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
