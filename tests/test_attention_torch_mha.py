"""Parity with ``torch.nn.MultiheadAttention`` (weights copied in by ``from_torch``).

Polarity: torch's ``key_padding_mask`` and bool ``attn_mask`` are True where a key is NOT
allowed; bertattn's ``key_padding_mask`` and ``mask`` are True where it is. A float torch
``attn_mask`` is additive, like bertattn's ``attn_bias``.
"""

from __future__ import annotations

import pytest
import torch
from attention_helpers import backend_names, keep_mask, returns_weights
from torch import nn

import bertattn

B, L, E, H = 3, 6, 16, 4
ATOL = 1e-5


def _torch_mha(batch_first: bool, bias: bool = True) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E, H, dropout=0.1, bias=bias, batch_first=batch_first).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


def _call_torch(m: nn.MultiheadAttention, x: torch.Tensor, **kw):  # x is (B, L, E)
    xt = x if m.batch_first else x.transpose(0, 1)
    out, w = m(xt, xt, xt, need_weights=True, average_attn_weights=False, **kw)
    return (out if m.batch_first else out.transpose(0, 1)), w


def _cases() -> dict[str, tuple[dict, dict]]:
    """name -> (torch kwargs, bertattn kwargs); every query row keeps >= 1 key."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([6, 3, 1])
    real = torch.arange(L)[None, :] < lengths[:, None]  # (B, L) True = real token
    keep = keep_mask((L, L), g)
    keep_b = keep_mask((B * H, L, L), g)
    bias = torch.randn(L, L, generator=g)
    pad_bias = torch.zeros(B, L).masked_fill(~real, float("-inf"))
    return {
        "none": ({}, {}),
        "key_padding_mask": ({"key_padding_mask": ~real}, {"key_padding_mask": real}),
        "bool attn_mask (L,L)": ({"attn_mask": ~keep}, {"mask": keep}),
        "bool attn_mask (B*H,L,L)": ({"attn_mask": ~keep_b}, {"mask": keep_b.view(B, H, L, L)}),
        "float attn_mask": ({"attn_mask": bias}, {"attn_bias": bias}),
        "float attn_mask + padding": (
            {"attn_mask": bias, "key_padding_mask": pad_bias},  # torch wants one mask type
            {"attn_bias": bias, "key_padding_mask": real},
        ),
        "causal + padding": (
            {
                "attn_mask": ~torch.ones(L, L, dtype=torch.bool).tril(),
                "key_padding_mask": ~real,
            },  # right padding: key 0 is real, every row keeps it
            {"mask": torch.ones(L, L, dtype=torch.bool).tril(), "key_padding_mask": real},
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("backend", backend_names())
@pytest.mark.parametrize("case", list(CASES))
def test_matches_torch_multihead_attention(batch_first: bool, backend: str, case: str) -> None:
    tm = _torch_mha(batch_first)
    ours = bertattn.MultiHeadAttention.from_torch(tm, backend=backend).eval()
    assert ours.dropout.p == pytest.approx(0.1)
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(4))
    tkw, okw = CASES[case]
    need = returns_weights(backend)
    with torch.no_grad():
        want_out, want_w = _call_torch(tm, x, **tkw)
        out, w = ours(x, need_weights=need, **okw)
    torch.testing.assert_close(out, want_out, atol=ATOL, rtol=0)
    if need:
        torch.testing.assert_close(w, want_w, atol=ATOL, rtol=0)
        # torch's default head average is the mean over our heads
        with torch.no_grad():
            xt = x if batch_first else x.transpose(0, 1)
            _, avg = tm(xt, xt, xt, need_weights=True, **tkw)
        torch.testing.assert_close(w.mean(dim=1), avg, atol=ATOL, rtol=0)


def test_cross_attention_and_no_bias() -> None:
    tm = _torch_mha(True, bias=False)
    ours = bertattn.MultiHeadAttention.from_torch(tm).eval()
    assert ours.q_linear.bias is None
    x, kv = torch.randn(2, 4, E), torch.randn(2, 7, E)
    real = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        want, want_w = tm(x, kv, kv, key_padding_mask=~real, average_attn_weights=False)
        for backend in backend_names():
            ours.backend = backend
            need = returns_weights(backend)
            out, w = ours(x, key_value=kv, key_padding_mask=real, need_weights=need)
            torch.testing.assert_close(out, want, atol=ATOL, rtol=0)
            if need:
                torch.testing.assert_close(w, want_w, atol=ATOL, rtol=0)


def test_from_torch_copies_not_aliases() -> None:
    tm = _torch_mha(True)
    ours = bertattn.MultiHeadAttention.from_torch(tm).eval()
    x = torch.randn(2, L, E)
    with torch.no_grad():
        before = ours(x)[0]
        tm.in_proj_weight.zero_()
        torch.testing.assert_close(ours(x)[0], before, atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kdim": 8}, "kdim == vdim == embed_dim only; got kdim=8, vdim=16, embed_dim=16"),
        ({"vdim": 8}, "kdim == vdim == embed_dim only; got kdim=16, vdim=8"),
        ({"add_bias_kv": True}, "does not support add_bias_kv=True or add_zero_attn=True"),
        ({"add_zero_attn": True}, "does not support add_bias_kv=True or add_zero_attn=True"),
    ],
)
def test_from_torch_refuses_what_it_cannot_copy(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bertattn.MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, **kwargs))


def test_from_torch_refuses_other_modules() -> None:
    with pytest.raises(ValueError, match="expects torch.nn.MultiheadAttention, got Linear"):
        bertattn.MultiHeadAttention.from_torch(nn.Linear(E, E))  # type: ignore[arg-type]
