"""benchmarks/attention_levers.py: every lever it times computes the attention it claims to.

Each lever's context ``(B, L, E)`` is compared with the ``math`` backend's on a small fused
projection, padded (one length) and packed (lengths that differ, a block size that does not
divide them). The fused kernel is held to the backends' float32 tolerance (1e-6 of the largest
value); the unfused ones, whose scale is folded into the product, to 1e-5 (docs/performance.md
reports their 1.0-1.6e-6).
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import attention_levers as lv
from bertattn.attention.backends import math_attention

HEADS = 3


def _qkv(d: int, b: int = 2, length: int = 20) -> torch.Tensor:
    g = torch.Generator().manual_seed(d)
    return torch.randn(b, length, 3 * HEADS * d, generator=g)  # (B, L, 3E)


def _math(qkv: torch.Tensor) -> torch.Tensor:
    """The reference written here from the backend: q, k, v sliced by hand, heads merged."""
    b, length, three_e = qkv.shape
    e = three_e // 3
    d = e // HEADS
    q, k, v = (qkv[..., i * e : (i + 1) * e].reshape(b, length, HEADS, d).transpose(1, 2)
               for i in range(3))  # fmt: skip
    ctx, _ = math_attention(q, k, v, None, dropout_p=0.0, need_weights=False)
    return ctx.transpose(1, 2).reshape(b, length, e)


def _close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=rel * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("d", [32, 64])
def test_padded_levers_equal_math(d: int) -> None:
    qkv = _qkv(d)
    want = _math(qkv)
    with torch.no_grad():
        _close(lv.sdpa(qkv, HEADS, copy=False), want, 1e-6)
        _close(lv.sdpa(qkv, HEADS, copy=True), want, 1e-6)
        _close(lv.bmm_all(qkv, HEADS), want, 1e-5)
        _close(lv.bmm_views(qkv, HEADS, None), want, 1e-5)
        _close(lv.bmm_views(qkv, HEADS, 8), want, 1e-5)  # blocks of 8, 8 and 4 rows
        _close(lv.sdpa_bf16(qkv, HEADS), want, 2e-2)  # bf16 inputs: 8 bits of mantissa


@pytest.mark.parametrize("d", [32, 64])
def test_packed_levers_equal_math_per_sequence(d: int) -> None:
    qkv = _qkv(d, b=1, length=23)[0]  # (T, 3E): sequences of 9, 1 and 13 tokens
    offsets = [0, 9, 10, 23]
    bounds = zip(offsets[:-1], offsets[1:], strict=True)
    want = torch.cat([_math(qkv[s:t].unsqueeze(0))[0] for s, t in bounds])
    with torch.no_grad():
        _close(lv.packed(qkv, HEADS, offsets, use_sdpa=True), want, 1e-6)
        _close(lv.packed(qkv, HEADS, offsets, use_sdpa=False), want, 1e-5)


def test_err_is_the_largest_difference_over_the_largest_value() -> None:
    want = torch.tensor([1.0, -4.0, 2.0])
    assert lv.err(torch.tensor([1.0, -4.0, 3.0]), want) == pytest.approx(0.25)
