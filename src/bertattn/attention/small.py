"""Small batched attention on the CPU: the math kernel where it is measured faster than SDPA.

The policy table (:mod:`bertattn.attention.policy`) decides by key length only, and its
``tiny`` class (keys <= 32) keeps fused SDPA because one sequence alone (B=1) runs faster
there. A batch of short texts is another shape: torch's CPU flash kernel pays a fixed cost per
(batch, head) block and per thread, while matmul + softmax + matmul batch the whole call.
Measured on a 2-core AMD EPYC (AVX2, torch 2.13.0, float32, H=12, D=32, a quarter of the keys
padded): with 2 threads math took 1.2-4.3x less time than SDPA from B=2 at 8-16 keys and
1.0-1.6x less at 32 keys, but only at 8-16 keys with 1 thread (0.86-0.92x at 32 keys); at B=1
SDPA was faster everywhere (math 0.5-0.8x). In ``Bert.encode`` on 400 short texts (batches
of 32 sorted by length): 3.8-4.3% more texts/s.

So the first call that could take either (CPU, float32, at least :data:`MIN_BATCH`
sequences, at most :data:`MAX_KEYS` keys, no weights, no dropout, not tracing or compiling)
decides once per intra-op thread count: both kernels are timed on ``(16, 12, L, 32)`` at 8 and
at 32 keys, and math is used only when it is at least :data:`MARGIN` times as fast at both.
``BERTATTN_SMALL_ATTENTION=math`` or ``sdpa`` (read at that first call) skips the timing;
``bertattn.explain()`` says which kernel ran and why.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from .gemm import _best

__all__ = ["CHOICES", "ENV", "MARGIN", "MAX_KEYS", "MIN_BATCH", "applies", "choice", "reset"]

log = logging.getLogger(__name__)

#: the environment variable that sets the choice instead of timing it
ENV = "BERTATTN_SMALL_ATTENTION"
#: what it may say
CHOICES = ("auto", "math", "sdpa")
#: math is chosen when at least this many times as fast as SDPA at both timed lengths
MARGIN = 1.15
#: the longest key length decided here (the policy table's ``tiny`` class)
MAX_KEYS = 32
#: the fewest sequences in a call decided here (one sequence alone: SDPA was faster)
MIN_BATCH = 2

_lock = threading.Lock()
_chosen: dict[int, tuple[bool, str]] = {}  # intra-op threads -> (math, why)


def applies(
    device_type: str, dtype: torch.dtype | None, batch: int | None, key_len: int | None
) -> bool:
    """The call is one this module decides (see the module docstring)."""
    return (
        device_type == "cpu"
        and dtype is torch.float32
        and batch is not None
        and batch >= MIN_BATCH
        and key_len is not None
        and key_len <= MAX_KEYS
    )


def choice() -> tuple[bool, str]:
    """``(math, why)`` for the calling thread's intra-op thread count (timed now if no small
    call has run at that count yet)."""
    threads = torch.get_num_threads()
    hit = _chosen.get(threads)
    if hit is not None:
        return hit
    with _lock:
        hit = _chosen.get(threads)
        if hit is None:
            hit = _chosen[threads] = _measure(threads)
            log.info("small batched attention, %d thread(s): %s", threads, hit[1])
    return hit


def reset() -> None:
    """Forget the choices: the next small call decides again (tests; after changing
    :data:`ENV`)."""
    with _lock:
        _chosen.clear()


def _measure(threads: int) -> tuple[bool, str]:
    """``(math, why)``; see the module docstring."""
    asked = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if asked not in CHOICES:
        raise ValueError(
            f"{ENV}={os.environ.get(ENV)!r} is not one of {', '.join(CHOICES)}; unset it to let "
            f"bertattn time both kernels, or set math or sdpa."
        )
    if asked != "auto":
        return asked == "math", f"{ENV}={asked}"
    from .backends import math_attention, sdpa_attention

    g = torch.Generator().manual_seed(0)
    ratios = []
    with torch.inference_mode():
        for keys in (8, MAX_KEYS):
            q, k, v = (torch.randn(16, 12, keys, 32, generator=g) for _ in range(3))
            bias = torch.zeros(16, 1, 1, keys)
            bias[..., keys - keys // 4 :] = float("-inf")  # a quarter of the keys padded
            args = (q, k, v, bias)
            sdpa = _best(lambda a=args: sdpa_attention(*a, dropout_p=0.0, need_weights=False))
            math = _best(lambda a=args: math_attention(*a, dropout_p=0.0, need_weights=False))
            ratios.append(sdpa / max(math, 1e-12))
    how = (
        f"math {ratios[0]:.2f}x / {ratios[1]:.2f}x the speed of fused SDPA at 8 / {MAX_KEYS} keys "
        f"(16x12xLx32), {threads} thread{'s' * (threads > 1)}"
    )
    if min(ratios) >= MARGIN:
        return True, f"measured {how}"
    return False, f"measured {how}; math is used from {MARGIN}x at both"
