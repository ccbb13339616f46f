"""The levers of issue 55 item 5, one float32 attention call at a time, against the product rate.

    python -m benchmarks.attention_levers [--heads-dims 32,64] [--lengths 128,256,512]
                                          [--tokens 1024] [--rounds 7] [--threads 1]

One self-attention call of shape ``(B, H, L, D)`` read from a fused ``(B, L, 3E)`` projection
(``B = tokens // L``, ``E = 384`` at ``D = 32``, ``768`` at ``D = 64``: MiniLM's and BERT-base's
widths, 12 heads), timed in this thread's CPU time with every lever alternated in each round
(medians). Each lever's time per FLOP (``4 B L^2 E``: scores and weighted sum) is divided by the
product rate: an ``nn.Linear(E, 4E)`` on the same ``B L`` rows (``8 B L E^2`` FLOPs), so a ratio
of 1.0 is an attention running at the rate of the model's products (the issue's bound is 1.5).

The levers (the attention's context lands as ``(B, L, E)``, heads merged, as the out
projection reads it):

* ``sdpa``: today's path, ``F.scaled_dot_product_attention`` on the strided q, k, v views, then
  the heads merged (a copy);
* ``sdpa_copy``: the same with q, k, v made contiguous first;
* ``bmm``: all heads of the batch in one batched product (``baddbmm`` over ``B H`` with the scale
  folded in, softmax in place, ``bmm``), on contiguous ``(B H, L, D)`` copies;
* ``bmm_views``: one batched product per sequence over its heads, reading q, k, v from the
  projection as strided views (no copy) and writing the context straight into ``(B, L, E)``;
* ``blocked``: ``bmm_views`` over blocks of ``--block`` query rows, so the ``(H, rows, L)``
  score tile stays in cache;
* ``packed_sdpa`` / ``packed_bmm``: the packed (varlen) case, lengths ``L/2 .. L``, one call per
  sequence (today's ``varlen``) against ``bmm_views`` per sequence; their FLOPs are the real
  tokens'.

``sdpa_bf16``: q, k, v cast to bfloat16 for torch's fused kernel (its scores, softmax and sums
in float32), the context cast back to float32; timed only where the CPU has native bf16 (an
``avx512_bf16`` or ``amx_bf16`` flag; torch emulates it elsewhere) or with ``--bf16``. torch 2.13
has no CPU batched product of bfloat16 inputs into a float32 output (``aten::bmm.dtype`` is
registered for CUDA only), so the unfused levers stay float32. Every lever's output is compared
with the ``math`` backend's (``err``: max abs difference over max abs value; the backend tests
hold float32 to 1e-6).

``--parts`` times the unfused path's three steps apart (``Q K^T``, the softmax, ``P V``, on
``(B H, L, D)`` tensors) and fused SDPA, in nanoseconds per score, against the time the ``4 D``
FLOPs of a score take at the product rate; ``--profile`` prints torch.profiler's table of one
batch of ``--paragraphs`` paragraphs (cut at 256 tokens) encoded by the default model with
``sdpa``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from bertattn.attention.backends import math_attention
from bertattn.runtime.cpu import cpu_flags

Lever = Callable[[], Tensor]


def split(qkv: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(B, L, 3E)`` -> q, k, v ``(B, H, L, D)`` strided views (no copy)."""
    b, length, three_e = qkv.shape
    d = three_e // (3 * heads)
    return qkv.view(b, length, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)


def merge(context: Tensor) -> Tensor:
    """``(B, H, L, D)`` -> ``(B, L, H D)``."""
    b, h, length, d = context.shape
    return context.transpose(1, 2).reshape(b, length, h * d)


def sdpa(qkv: Tensor, heads: int, copy: bool) -> Tensor:
    q, k, v = split(qkv, heads)
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return merge(F.scaled_dot_product_attention(q, k, v))


def sdpa_bf16(qkv: Tensor, heads: int) -> Tensor:
    """Fused SDPA on bfloat16 copies of q, k, v; the context back in float32 ``(B, L, E)``."""
    q, k, v = (t.to(torch.bfloat16) for t in split(qkv, heads))
    return merge(F.scaled_dot_product_attention(q, k, v)).float()


def bmm_all(qkv: Tensor, heads: int) -> Tensor:
    """One ``baddbmm`` over all ``B H`` heads (contiguous copies), softmax in place, ``bmm``."""
    q, k, v = split(qkv, heads)
    b, h, length, d = q.shape
    q, k, v = (t.reshape(b * h, length, d) for t in (q, k, v))  # copies: (B H, L, D)
    scores = torch.baddbmm(
        q.new_empty(b * h, length, length), q, k.transpose(1, 2), beta=0.0, alpha=d**-0.5
    )  # (B H, L, L)
    torch.softmax(scores, -1, out=scores)
    return merge(torch.bmm(scores, v).view(b, h, length, d))


def attend_views(q: Tensor, k: Tensor, v: Tensor, out: Tensor, block: int | None) -> None:
    """One sequence: q ``(H, Lq, D)``, k, v ``(H, Lk, D)`` strided views; writes the context
    into ``out`` ``(Lq, H, D)``, ``block`` query rows at a time (None: all)."""
    h, lq, d = q.shape
    kt = k.transpose(1, 2)  # (H, D, Lk)
    step = lq if block is None else block
    buf = q.new_empty(h, min(step, lq), k.size(1))  # (H, rows, Lk)
    ctx = q.new_empty(h, min(step, lq), d)  # (H, rows, D)
    for start in range(0, lq, step):
        rows = min(step, lq - start)
        s = buf[:, :rows]
        torch.baddbmm(s, q[:, start : start + rows], kt, beta=0.0, alpha=d**-0.5, out=s)
        torch.softmax(s, -1, out=s)
        c = ctx[:, :rows]
        torch.bmm(s, v, out=c)
        out[start : start + rows].copy_(c.transpose(0, 1))


def bmm_views(qkv: Tensor, heads: int, block: int | None) -> Tensor:
    q, k, v = split(qkv, heads)  # (B, H, L, D) views
    b, h, length, d = q.shape
    out = qkv.new_empty(b, length, h, d)
    for i in range(b):
        attend_views(q[i], k[i], v[i], out[i], block)
    return out.view(b, length, h * d)


def packed(qkv: Tensor, heads: int, offsets: list[int], use_sdpa: bool) -> Tensor:
    """``qkv`` ``(T, 3E)`` packed; one call per sequence."""
    t, three_e = qkv.shape
    d = three_e // (3 * heads)
    q, k, v = qkv.view(t, 3, heads, d).unbind(1)  # (T, H, D)
    out = qkv.new_empty(t, heads, d)
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # (H, l, D)
        if use_sdpa:
            o = F.scaled_dot_product_attention(qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0))
            out[start:end] = o[0].transpose(0, 1)
        else:
            attend_views(qs, ks, vs, out[start:end], None)
    return out.view(t, heads * d)


def reference(qkv: Tensor, heads: int) -> Tensor:
    q, k, v = split(qkv, heads)
    ctx, _ = math_attention(q, k, v, None, dropout_p=0.0, need_weights=False)
    return merge(ctx)


def time_levers(levers: dict[str, Lever], rounds: int, clock: Callable[[], float]) -> dict:
    """Median seconds per call of each lever, alternated within every round."""
    for fn in levers.values():
        fn()  # warm
    spent: dict[str, list[float]] = {name: [] for name in levers}
    for _ in range(rounds):
        for name, fn in levers.items():
            n, t0 = 0, clock()
            while True:
                fn()
                n += 1
                if clock() - t0 >= 0.05:
                    break
            spent[name].append((clock() - t0) / n)
    return {name: statistics.median(s) for name, s in spent.items()}


def err(got: Tensor, want: Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def one_shape(
    d: int, length: int, tokens: int, rounds: int, block: int, clock, bf16: bool
) -> list[str]:
    heads = 12
    e = heads * d
    b = max(1, tokens // length)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, length, e, generator=g)
    w_qkv = torch.randn(3 * e, e, generator=g) / math.sqrt(e)
    qkv = F.linear(x, w_qkv)  # (B, L, 3E)
    lin = torch.nn.Linear(e, 4 * e)
    rows = x.view(b * length, e)
    lens = torch.randint(length // 2, length + 1, (b,), generator=g).tolist()
    offsets = [0, *torch.tensor(lens).cumsum(0).tolist()]
    flat = qkv.view(b * length, 3 * e)[: offsets[-1]]  # (T, 3E): lengths L/2..L
    levers: dict[str, Lever] = {
        "linear": lambda: lin(rows),
        "sdpa": lambda: sdpa(qkv, heads, False),
        "sdpa_copy": lambda: sdpa(qkv, heads, True),
        "bmm": lambda: bmm_all(qkv, heads),
        "bmm_views": lambda: bmm_views(qkv, heads, None),
        "blocked": lambda: bmm_views(qkv, heads, block),
        "packed_sdpa": lambda: packed(flat, heads, offsets, True),
        "packed_bmm": lambda: packed(flat, heads, offsets, False),
    }
    if bf16:
        levers["sdpa_bf16"] = lambda: sdpa_bf16(qkv, heads)
    with torch.no_grad():
        want = reference(qkv, heads)
        bounds = zip(offsets[:-1], offsets[1:], strict=True)
        want_packed = torch.cat([reference(flat[s:t].unsqueeze(0), heads)[0] for s, t in bounds])
        errs = {n: err(f(), want_packed if n.startswith("packed") else want)
                for n, f in levers.items() if n != "linear"}  # fmt: skip
        secs = time_levers(levers, rounds, clock)
    rate = secs["linear"] / (8 * b * length * e * e)  # s per product FLOP
    lines = []
    for name in levers:
        if name == "linear":
            continue
        real = sum(n * n for n in lens) if name.startswith("packed") else b * length * length
        attn_rate = secs[name] / (4 * real * e)
        lines.append(f"{d:>3}{length:>5}{b:>4}  {name:<12}{secs[name] * 1e3:>9.3f}"
                     f"{4 * real * e / secs[name] / 1e9:>9.1f}{attn_rate / rate:>7.2f}"
                     f"{errs[name]:>10.1e}")  # fmt: skip
    lines.append(f"{d:>3}{length:>5}{b:>4}  {'(linear)':<12}{secs['linear'] * 1e3:>9.3f}"
                 f"{1 / rate / 1e9:>9.1f}{1.0:>7.2f}")  # fmt: skip
    return lines


def parts(d: int, length: int, tokens: int, rounds: int, clock: Callable[[], float]) -> str:
    """The unfused path's steps apart, and fused SDPA, in nanoseconds per score."""
    heads, b = 12, max(1, tokens // length)
    e = heads * d
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b * heads, length, d, generator=g) for _ in range(3))
    s = torch.empty(b * heads, length, length)  # (B H, L, L)
    o = torch.empty(b * heads, length, d)
    lin, rows = torch.nn.Linear(e, 4 * e), torch.randn(b * length, e, generator=g)
    q4, k4, v4 = (t.view(b, heads, length, d) for t in (q, k, v))
    steps: dict[str, Lever] = {
        "QK^T": lambda: torch.baddbmm(s, q, k.transpose(1, 2), beta=0.0, alpha=d**-0.5, out=s),
        "softmax": lambda: torch.softmax(s, -1, out=s),
        "PV": lambda: torch.bmm(s, v, out=o),
        "sdpa": lambda: F.scaled_dot_product_attention(q4, k4, v4),
        "linear": lambda: lin(rows),
    }
    with torch.no_grad():
        secs = time_levers(steps, rounds, clock)
    per_flop = secs.pop("linear") / (8 * b * length * e * e)
    scores = b * heads * length * length
    cells = "  ".join(f"{name} {t / scores * 1e9:.2f}" for name, t in secs.items())
    return f"{d:>3}{length:>5}{b:>4}  {cells}  (at the product rate: {4 * d * per_flop * 1e9:.2f})"


def profile_paragraphs(paragraphs: int) -> str:
    """torch.profiler's table of one batch of paragraphs encoded by the default model (sdpa)."""
    from torch.profiler import ProfilerActivity, profile

    from bertattn import Bert

    from .corpus import stdlib_paragraph_corpus

    bert = Bert.load(dtype="float32", backend="sdpa")
    texts = stdlib_paragraph_corpus(paragraphs)
    bert.encode(texts, max_length=256, batch_size=paragraphs)  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        bert.encode(texts, max_length=256, batch_size=paragraphs)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads-dims", default="32,64")
    p.add_argument("--lengths", default="128,256,512")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parts", action="store_true", help="the unfused path's steps apart")
    p.add_argument("--profile", action="store_true", help="profile one batch of paragraphs")
    p.add_argument("--paragraphs", type=int, default=16)
    p.add_argument("--bf16", action="store_true", help="time sdpa_bf16 even where emulated")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    bf16 = bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))
    print(f"torch {torch.__version__}, {args.threads} thread(s), "
          f"{'CPU' if args.threads == 1 else 'wall'} time, median of {args.rounds}; native bf16: "
          f"{'yes' if bf16 else 'no (sdpa_bf16 timed only with --bf16)'}")  # fmt: skip
    shapes = [(int(d), int(n)) for d in args.heads_dims.split(",") for n in args.lengths.split(",")]
    if args.profile:
        print(profile_paragraphs(args.paragraphs))
        return 0
    if args.parts:
        print(f"{'D':>3}{'L':>5}{'B':>4}  ns per score")
        for d, length in shapes:
            print(parts(d, length, args.tokens, args.rounds, clock), flush=True)
        return 0
    print(f"{'D':>3}{'L':>5}{'B':>4}  {'lever':<12}{'ms':>9}{'GFLOP/s':>9}{'ratio':>7}{'err':>10}")
    for d, length in shapes:
        for line in one_shape(
            d, length, args.tokens, args.rounds, args.block, clock, bf16 or args.bf16
        ):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
