"""The blocks Gemma 3 adds to bertattn.blocks, each against a plain reference written here
(float64 formulas, not the code under test): the offset RMSNorm, the scaled word embeddings
and the sandwich block."""

from __future__ import annotations

import math

import pytest
import torch
from attention_helpers import noisy

from bertattn import MultiHeadAttention
from bertattn.blocks import (
    FeedForward,
    OffsetRMSNorm,
    SandwichBlock,
    ScaledTokenEmbeddings,
    make_norm,
)


def test_offset_rms_norm_scales_by_one_plus_its_weight() -> None:
    norm = noisy(make_norm(6, 1e-6, bias=False, kind="offset_rms_norm"))
    assert isinstance(norm, OffsetRMSNorm)
    x = torch.randn(3, 6).double()
    rms = torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    want = x / rms * (1 + norm.weight.double())
    torch.testing.assert_close(norm(x.float()).double(), want, atol=1e-5, rtol=0)
    # zeros (a fresh norm) is the identity scale; the output keeps the input's dtype
    fresh = OffsetRMSNorm(6)
    torch.testing.assert_close(fresh(x.float()).double(), x / rms, atol=1e-5, rtol=0)
    assert norm(x.to(torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        make_norm(6, 1e-6, bias=True, kind="offset_rms_norm")


def test_scaled_embeddings_multiply_the_word_rows_only() -> None:
    emb = ScaledTokenEmbeddings(11, 4, math.sqrt(4.5), padding_idx=0).eval()
    ids = torch.tensor([[3, 7, 0]])
    want = emb.word.weight.double()[ids] * math.sqrt(4.5)
    torch.testing.assert_close(emb(ids).double(), want, atol=1e-6, rtol=0)
    packed = torch.tensor([3, 7])  # (T,) -> (T, E)
    torch.testing.assert_close(emb(packed), emb(ids)[0, :2])
    given = torch.randn(1, 2, 4)  # embeddings given are taken as they are
    torch.testing.assert_close(emb(None, inputs_embeds=given), given)
    # in bfloat16 the factor is rounded to the table's dtype first (sqrt(4.5) -> 2.125)
    half = emb.to(torch.bfloat16)
    factor = torch.tensor(math.sqrt(4.5), dtype=torch.bfloat16)
    assert factor.item() != math.sqrt(4.5)
    torch.testing.assert_close(half(ids), half.word(ids) * factor, atol=0, rtol=0)


def test_sandwich_block_norms_each_branch_in_and_out() -> None:
    attn = noisy(MultiHeadAttention(8, 2, dropout=0.0))
    mlp = noisy(FeedForward(8, 5, "relu"), 2)
    norms = tuple(noisy(OffsetRMSNorm(8), 3 + i) for i in range(4))
    block = SandwichBlock(attn, mlp, norms).eval()  # type: ignore[arg-type]
    x = torch.randn(2, 7, 8)

    def attend(t: torch.Tensor) -> torch.Tensor:
        return attn(t, need_weights=False)[0]

    n_in, n_out, m_in, m_out = norms
    h = x + n_out(attend(n_in(x)))
    want = h + m_out(mlp(m_in(h)))
    torch.testing.assert_close(block(x, attend), want, atol=1e-6, rtol=0)
    assert block.attn_norm is n_in and block.post_attn_norm is n_out
    assert block.mlp_norm is m_in and block.post_mlp_norm is m_out
