"""Long texts in float32: how far ``Bert.encode`` is from what its products alone allow.

    python -m benchmarks.long_texts [--paragraphs 40] [--rounds 7] [--dtype float32]

On ~250-token paragraphs (standard-library docstrings, truncated at 256 tokens) it prints:

- ``Bert.encode`` texts/s with the model's row chunks (:mod:`bertattn.encoder.chunks`) side by
  side on its chunk workers (:mod:`bertattn.runtime.workers`, the default), one after another
  (``chunk_workers = 1``) and without them (``chunk_tokens = 0``: each batch of 32 in one
  piece), interleaved, medians;
- the bound: the same batches' matrix products alone (the four linear layers of every layer,
  at the chunks' row counts, on the model's weights) plus their attention alone (sdpa on
  ``(rows, H, L, D)`` with the padding mask), timed on their own; texts/s if every other op
  (embeddings, GELU, residual adds, LayerNorm, tokenizing, pooling) cost nothing;
- encode's share of that bound, and of the machine's GEMM rate (2048^3, this process's
  threads): the useful FLOPs (linear layers and attention on real tokens) per second.

The bound is what no fp32 eager path of these ops can beat on this CPU: a target above it
(e.g. 1.2x a peer already near it) is not reachable by removing passes between products.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from bertattn import Bert
from bertattn.attention import gemm
from bertattn.bench import auto_line, environment, interleaved_medians
from bertattn.encoder.chunks import plan_chunks
from bertattn.encoder.pooling import length_batches

from .corpus import stdlib_paragraph_corpus
from .shared import gemm_rate, model_flops


def _pieces(bert: Bert, lengths: list[int], batch_size: int = 32) -> list[tuple[int, int]]:
    """``(rows, padded length)`` of every model call encode makes: its length-sorted batches,
    each cut into the model's row chunks as planned for its workers."""
    budget = bert.model.chunk_budget
    workers = bert.model._workers_at(torch.get_num_threads())  # the model's own rule
    ordered = sorted(lengths, reverse=True)
    out = []
    for start, end in length_batches(ordered, batch_size):
        rows = ordered[start:end]
        out.extend((b - a, rows[0]) for a, b in plan_chunks(rows, budget, workers))
    return out


def _bound_seconds(bert: Bert, pieces: list[tuple[int, int]], repeats: int) -> tuple[float, float]:
    """(products, attention) seconds for ``pieces``, each timed alone, best of ``repeats``; the
    products through the library bertattn chose for them (MKL or oneDNN)."""
    model = bert.model
    cfg = model.config
    h, e = cfg.num_attention_heads, cfg.hidden_size
    d = e // h
    dtype = model.dtype
    weights = []
    for layer in model.encoder.layers:
        wqkv, bqkv = layer.attn.qkv_weight()
        weights.append(
            [
                (wqkv, bqkv),
                (layer.attn.out_linear.weight, layer.attn.out_linear.bias),
                (layer.mlp.fc_in.weight, layer.mlp.fc_in.bias),
                (layer.mlp.fc_out.weight, layer.mlp.fc_out.bias),
            ]
        )
    inputs = []
    for rows, length in pieces:
        t = rows * length
        xs = [torch.randn(t, w.shape[1], dtype=dtype) for w, _ in weights[0]]
        qkv = torch.randn(rows, length, 3, h, d, dtype=dtype).permute(2, 0, 3, 1, 4)
        mask = torch.zeros(rows, 1, 1, length, dtype=dtype)
        inputs.append((xs, qkv, mask))

    def products() -> None:
        for xs, _, _ in inputs:
            for layer in weights:
                for x, (w, b) in zip(xs, layer, strict=True):
                    gemm.linear(x, w, b)  # the library the model's products use

    def attention() -> None:
        for _, qkv, mask in inputs:
            q, k, v = qkv.unbind(0)
            for _ in weights:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    best = []
    with torch.inference_mode():
        for fn in (products, attention):
            fn()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            best.append(min(times))
    return best[0], best[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long_texts", description=__doc__)
    parser.add_argument("--paragraphs", type=int, default=40, help="paragraphs (default 40)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--dtype", default="float32", help="float32 (default) or bfloat16")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*truncated")
    texts = stdlib_paragraph_corpus(args.paragraphs)
    chunked = Bert.load(dtype=args.dtype)
    serial = Bert.load(dtype=args.dtype)
    whole = Bert.load(dtype=args.dtype)
    for bert in (chunked, serial, whole):
        bert.max_length = min(bert.max_length, 256)
        bert.governor = None  # the same threads throughout: a quiet machine
    serial.model.chunk_workers = 1
    whole.model.chunk_tokens = 0
    lengths = [len(e.ids) for e in chunked.tokenizer.encode_batch(texts, max_length=256)]
    fns = {
        "chunked": lambda: chunked.encode(texts),
        "chunks serial": lambda: serial.encode(texts),
        "whole batches": lambda: whole.encode(texts),
    }
    timer = interleaved_medians(fns, repeats=args.rounds, warmup=1)
    rates = {name: len(texts) / timer.median(name) for name in fns}
    pieces = _pieces(chunked, lengths)
    gemm_s, attn_s = _bound_seconds(chunked, pieces, max(3, args.rounds // 2))
    bound = len(texts) / (gemm_s + attn_s)
    flops = model_flops(chunked.model.config, lengths)
    dtype = chunked.model.dtype
    machine = gemm_rate(dtype) * 1e12
    env = environment()
    print(
        f"cpu: {env['processor']}, capability {env['cpu_capability']}; torch {env['torch']}; "
        f"{torch.get_num_threads()} threads; {args.dtype}"
    )
    print(f"  {auto_line(env)}")
    print(
        f"{len(texts)} paragraphs, {sum(lengths)} tokens; model calls (rows x length): "
        + ", ".join(f"{r}x{n}" for r, n in pieces)
    )
    for name, rate in rates.items():
        print(f"  encode, {name:<14} {rate:7.1f} texts/s")
    print(
        f"  bound: products {gemm_s * 1e3:.0f} ms + attention {attn_s * 1e3:.0f} ms -> "
        f"{bound:.1f} texts/s if nothing else cost anything"
    )
    share = rates["chunked"] / bound
    useful = rates["chunked"] * flops / len(texts)
    print(f"  encode (chunked) at {share:.0%} of the bound")
    print(
        f"  useful FLOP rate {useful / 1e12:.3f} TFLOP/s = {useful / machine:.0%} of the "
        f"machine's {args.dtype} GEMM rate ({machine / 1e12:.3f} TFLOP/s, 2048^3); the bound "
        f"is {bound * flops / len(texts) / machine:.0%}"
    )
    for other in ("chunks serial", "whole batches"):
        per_round = [
            w / c for c, w in zip(timer.samples["chunked"], timer.samples[other], strict=True)
        ]
        print(
            f"  chunked / {other}, median of per-round ratios: {statistics.median(per_round):.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
