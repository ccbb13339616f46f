"""PyTorch's compiled FlexAttention on the CPU against the SDPA call bertattn makes.

    python -m benchmarks.flex_attention [--rounds 9] [--threads N]

The attention of an encoder's padded batch: queries, keys and values ``(B, H, L, D)`` in
float32, a key padding mask from each sequence's length (lengths drawn in ``[L/2, L]``, seeded),
at head sizes 32 (MiniLM, 12 heads) and 64 (BERT-base, 12 heads), for a batch of paragraphs
(4 x 256, one row chunk) and of short texts (32 x 32). Peers, interleaved round by round, the
median of each:

- ``sdpa``: ``F.scaled_dot_product_attention`` with the boolean ``(B, 1, 1, L)`` mask, the call
  bertattn's encoder makes on a padded batch;
- ``flex``: ``torch.compile(flex_attention)`` with a ``BlockMask`` built from the same lengths
  (its building is outside the timing: an encoder would build it once per batch and reuse it in
  every layer).

Each prints its largest difference on the real rows against a float64 reference, and the verdict
the compiled path is held to: FlexAttention may be offered only where it is faster than SDPA at
both head sizes and as exact as SDPA. Timing: wall clock.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from bertattn.bench import environment, interleaved_medians

SHAPES = (  # name, B, L, H, D
    ("paragraphs, head size 32", 4, 256, 12, 32),
    ("paragraphs, head size 64", 4, 256, 12, 64),
    ("short texts, head size 32", 32, 32, 12, 32),
    ("short texts, head size 64", 32, 32, 12, 64),
)


def _inputs(b: int, seq: int, h: int, d: int, seed: int = 0):
    """``(q, k, v, lengths)``: random ``(B, H, L, D)`` float32 and lengths in ``[L/2, L]``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, seq, d, generator=g) for _ in range(3))
    lengths = torch.randint(seq // 2, seq + 1, (b,), generator=g)
    lengths[0] = seq  # one full row, as a length-sorted batch has
    return q, k, v, lengths


def _reference(q, k, v, lengths) -> torch.Tensor:
    """The float64 softmax(q·kᵀ/√d + mask)·v."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    scores = q64 @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5
    keep = torch.arange(q.shape[2])[None, :] < lengths[:, None]  # (B, L)
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


def _real_rows_error(out: torch.Tensor, ref: torch.Tensor, lengths) -> float:
    """Largest absolute difference over the rows of real tokens."""
    return max(
        float((out[i, :, :n].double() - ref[i, :, :n]).abs().max())
        for i, n in enumerate(lengths.tolist())
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flex_attention", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (default 9)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timed round (default 20)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    env = environment()
    print(
        f"FlexAttention (compiled) vs SDPA, float32, padded batches; threads="
        f"{torch.get_num_threads()}, {env['processor']}, cpu_capability={env['cpu_capability']}, "
        f"torch {env['torch']}"
    )
    flex = torch.compile(flex_attention, dynamic=False)
    verdicts: list[bool] = []
    for name, b, seq, h, d in SHAPES:
        q, k, v, lengths = _inputs(b, seq, h, d)
        keep = (torch.arange(seq)[None, :] < lengths[:, None])[:, None, None, :]

        def key_padding(bi, hi, qi, ki, lengths=lengths):
            return ki < lengths[bi]

        start = time.perf_counter()
        try:
            block_mask = create_block_mask(key_padding, b, None, seq, seq, device="cpu")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out_flex = flex(q, k, v, block_mask=block_mask)
        except Exception as exc:  # the compiler's failures are many: report, do not judge
            print(f"  {name}: FlexAttention did not compile here: {type(exc).__name__}: {exc}")
            verdicts.append(False)
            continue
        compile_s = time.perf_counter() - start
        with torch.inference_mode():
            out_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        ref = _reference(q, k, v, lengths)
        err_sdpa = _real_rows_error(out_sdpa, ref, lengths)
        err_flex = _real_rows_error(out_flex, ref, lengths)

        def run_sdpa(q=q, k=k, v=v, keep=keep):
            with torch.inference_mode():
                for _ in range(args.calls):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

        def run_flex(q=q, k=k, v=v, block_mask=block_mask):
            with torch.inference_mode():
                for _ in range(args.calls):
                    flex(q, k, v, block_mask=block_mask)

        timer = interleaved_medians({"sdpa": run_sdpa, "flex": run_flex}, repeats=args.rounds)
        t_sdpa = timer.median("sdpa") / args.calls
        t_flex = timer.median("flex") / args.calls
        speed = t_sdpa / t_flex
        # as exact as SDPA: within twice its error against float64, or within float32 rounding
        exact = err_flex <= max(2 * err_sdpa, 1e-6)
        verdicts.append(speed > 1.0 and exact)
        print(
            f"  {name} (B={b}, L={seq}, H={h}, D={d}): sdpa {t_sdpa * 1e3:.3f} ms, flex "
            f"{t_flex * 1e3:.3f} ms = {speed:.2f}x sdpa's speed; max error vs float64 sdpa "
            f"{err_sdpa:.1e}, flex {err_flex:.1e}; compile {compile_s:.1f} s"
        )
    faster = all(verdicts)
    print(
        "  verdict: "
        + (
            "FlexAttention faster than SDPA and as exact at every shape here"
            if faster
            else "FlexAttention not faster than SDPA (or not as exact) at every shape here: "
            "not offered on this CPU"
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
