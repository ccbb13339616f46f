"""Masks: fully masked query rows on every backend and dtype; every error message, by text."""

from __future__ import annotations

import re

import pytest
import torch
from attention_helpers import DTYPES, article_pair, backend_names, random_module, returns_weights

import bertattn

B, L, E, H = 3, 5, 16, 4


def _dead_row_inputs() -> dict:
    """Sequence 1 is all padding; in the mask, query row 2 attends to nothing."""
    kpm = torch.ones(B, L, dtype=torch.bool)
    kpm[1] = False  # a sequence with no real token
    kpm[2, 3:] = False
    mask = torch.ones(L, L, dtype=torch.bool)
    mask[2] = False  # one query row with no key
    return {"key_padding_mask": kpm, "mask": mask}


def _dead_rows_of(kw: dict) -> torch.Tensor:
    """(B, Lq) True where the query row has no key left."""
    keep = kw["mask"][None] & kw["key_padding_mask"][:, None, :]  # (B, Lq, Lk)
    return ~keep.any(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_names())
def test_fully_masked_rows_give_zero_weights_and_context(backend: str, dtype) -> None:
    """A query row with no key gets zero weights and a zero context: output = out_linear.bias.

    This differs from the article on purpose: its ``masked_fill(-1e9)`` + softmax gives such a
    row *uniform* weights over the padding (an average of padding values), see
    :func:`test_article_gives_uniform_weights_on_dead_rows`.
    """
    m = random_module(E, H, dtype=dtype)
    m.backend = backend
    kw = _dead_row_inputs()
    dead = _dead_rows_of(kw)
    assert dead[1].all() and dead[0, 2] and not dead[0, 0]
    x = torch.randn(B, L, E, dtype=dtype, requires_grad=True)
    need = returns_weights(backend)
    out, w = m(x, need_weights=need, **kw)
    assert not torch.isnan(out).any()
    bias = m.out_linear.bias.detach()
    torch.testing.assert_close(out.detach()[dead], bias.expand(int(dead.sum()), E), atol=0, rtol=0)
    assert not torch.allclose(out.detach()[~dead], bias.expand(int((~dead).sum()), E))
    if need:
        assert w is not None and not torch.isnan(w).any()
        assert (w.transpose(1, 2)[dead] == 0).all()  # (n_dead, H, Lk)
        torch.testing.assert_close(
            w.transpose(1, 2)[~dead].float().sum(-1),
            torch.ones(int((~dead).sum()), H),
            atol=1e-2 if dtype != torch.float32 else 1e-6,
            rtol=0,
        )
    (out.float() * torch.randn(out.shape)).sum().backward()
    grads = [x.grad] + [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # a dead row's query does not influence anything: its input gradient comes only via k, v
    x2 = x.detach().clone().requires_grad_(True)
    out2, _ = m(x2, need_weights=False, **kw)
    out2[1].float().sum().backward()  # sequence 1: every row dead
    assert (x2.grad == 0).all()


def test_article_gives_uniform_weights_on_dead_rows() -> None:
    """The documented difference: the article averages over padding where ours gives zeros."""
    article, ours = article_pair(E, H)
    kw = _dead_row_inputs()
    x = torch.randn(B, L, E)
    art_mask = kw["mask"][None, None] & kw["key_padding_mask"][:, None, None, :]
    with torch.no_grad():
        _, aw = article(x, art_mask)
        out, w = ours(x, art_mask)
    torch.testing.assert_close(aw[1], torch.full((H, L, L), 1 / L))
    assert (w[1] == 0).all()
    torch.testing.assert_close(out[1], ours.out_linear.bias.detach().expand(L, E))
    live = ~_dead_rows_of(kw)  # elsewhere they agree
    torch.testing.assert_close(w.transpose(1, 2)[live], aw.transpose(1, 2)[live], atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", backend_names())
def test_minus_inf_attn_bias_row_is_dead_too(backend: str) -> None:
    m = random_module(E, H)
    m.backend = backend
    bias = torch.zeros(L, L)
    bias[0] = float("-inf")
    x = torch.randn(2, L, E)
    with torch.no_grad():
        out, _ = m(x, attn_bias=bias, need_weights=False)
    torch.testing.assert_close(out[:, 0], m.out_linear.bias.detach().expand(2, E))
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------------------- errors
def _m() -> bertattn.MultiHeadAttention:
    return bertattn.MultiHeadAttention(E, H).eval()


X = torch.randn(B, L, E)

FORWARD_ERRORS = [
    (
        "mask cannot broadcast",
        (X,),
        {"mask": torch.ones(4, 4)},
        r"mask of shape \(4, 4\) cannot broadcast to \(batch, heads, query_len, key_len\) "
        r"= \(3, 4, 5, 5\)",
    ),
    (
        "mask 5-D",
        (X,),
        {"mask": torch.ones(1, 1, 1, 5, 5)},
        r"mask has 5 dimensions \(1, 1, 1, 5, 5\); expected at most 4",
    ),
    (
        "(B, L) mask as mask",
        (X,),
        {"mask": torch.ones(B, L)},
        r"mask of shape \(3, 5\) looks like a per-token padding mask.*key_padding_mask=",
    ),
    (
        "complex mask",
        (X,),
        {"mask": torch.ones(L, L, dtype=torch.complex64)},
        r"mask has dtype torch.complex64; expected bool, an integer or a real float.*\.bool\(\)",
    ),
    (
        "complex key_padding_mask",
        (X,),
        {"key_padding_mask": torch.ones(B, L, dtype=torch.cfloat)},
        r"key_padding_mask has dtype torch.complex64",
    ),
    ("non-tensor mask", (X,), {"mask": [[1]]}, r"mask must be a torch.Tensor or None, got list"),
    (
        "bool attn_bias",
        (X,),
        {"attn_bias": torch.ones(L, L, dtype=torch.bool)},
        r"attn_bias must be a floating-point tensor added to the scores, got torch.bool.*mask=",
    ),
    (
        "int attn_bias",
        (X,),
        {"attn_bias": torch.ones(L, L, dtype=torch.long)},
        r"attn_bias must be a floating-point tensor.*got torch.int64",
    ),
    (
        "attn_bias cannot broadcast",
        (X,),
        {"attn_bias": torch.ones(2, L)},
        r"attn_bias of shape \(2, 5\) cannot broadcast",
    ),
    (
        "key_padding_mask wrong shape",
        (X,),
        {"key_padding_mask": torch.ones(B, L + 1)},
        r"key_padding_mask has shape \(3, 6\); expected \(batch, key_len\) = \(3, 5\)",
    ),
    (
        "key_padding_mask 4-D",
        (X,),
        {"key_padding_mask": torch.ones(B, 1, 1, L)},
        r"key_padding_mask has shape \(3, 1, 1, 5\); expected \(batch, key_len\)",
    ),
    (
        "x 4-D",
        (torch.randn(1, B, L, E),),
        {},
        r"x has shape \(1, 3, 5, 16\); expected 3-D \(batch, seq_len, embed_dim\)",
    ),
    ("x 1-D", (torch.randn(E),), {}, r"x has shape \(16\); expected 3-D"),
    (
        "x width",
        (torch.randn(B, L, E + 1),),
        {},
        r"x has width 17 \(shape \(3, 5, 17\)\); this module was built with embed_dim=16",
    ),
    ("x not a tensor", ([[0.0]],), {}, r"x must be a torch.Tensor, got list"),
    (
        "x dtype",
        (X.double(),),
        {},
        r"x has dtype torch.float64 but the module's weights are torch.float32; "
        r"call module.to\(torch.float64\)",
    ),
    (
        "key_value width",
        (X,),
        {"key_value": torch.randn(B, 7, 8)},
        r"key_value has width 8 \(shape \(3, 7, 8\)\); this module was built with embed_dim=16",
    ),
    (
        "key_value ndim",
        (X,),
        {"key_value": torch.randn(7, E)},
        r"key_value has shape \(7, 16\); expected 3-D",
    ),
    (
        "key_value dtype",
        (X,),
        {"key_value": torch.randn(B, 7, E).half()},
        r"key_value has dtype torch.float16 but the module's weights are torch.float32",
    ),
    (
        "key_value batch",
        (X,),
        {"key_value": torch.randn(2, 7, E)},
        r"key_value has batch size 2 but x has 3; they must match",
    ),
    (
        "padding of key_value length",
        (X,),
        {"key_value": torch.randn(B, 7, E), "key_padding_mask": torch.ones(B, L)},
        r"key_padding_mask has shape \(3, 5\); expected \(batch, key_len\) = \(3, 7\)",
    ),
]


@pytest.mark.parametrize(
    "args, kwargs, match", [c[1:] for c in FORWARD_ERRORS], ids=[c[0] for c in FORWARD_ERRORS]
)
def test_forward_error_messages(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        _m()(*args, **kwargs)


def test_unknown_backend_lists_valid_names() -> None:
    valid = ", ".join(sorted([*bertattn.BACKENDS, "auto"]))
    match = re.escape(f"unknown attention backend 'flash9'; valid names: {valid}.")
    with pytest.raises(ValueError, match=match):
        bertattn.MultiHeadAttention(E, H, backend="flash9")
    m = _m()
    m.backend = "flash9"  # set after construction: refused at the call
    with pytest.raises(ValueError, match=match):
        m(X, need_weights=False)


def test_sdpa_asked_for_weights() -> None:
    m = bertattn.MultiHeadAttention(E, H, backend="sdpa")
    with pytest.raises(
        ValueError,
        match=r"backend 'sdpa' does not return attention weights; pass need_weights=False, "
        r"or use backend='math' \(or 'auto'",
    ):
        m(X)  # need_weights defaults to True
    out, w = m(X, need_weights=False)
    assert w is None and out.shape == X.shape


@pytest.mark.parametrize(
    "args, match",
    [
        ((10, 3), r"embed_dim \(10\) must be a positive multiple of num_heads \(3\)"),
        ((0, 1), r"embed_dim \(0\) must be a positive multiple of num_heads \(1\)"),
        ((8, 0), r"embed_dim \(8\) must be a positive multiple of num_heads \(0\)"),
        ((8.0, 2), r"embed_dim and num_heads must be ints, got 8.0 and 2"),
    ],
)
def test_constructor_error_messages(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        bertattn.MultiHeadAttention(*args)


def test_dropout_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        bertattn.MultiHeadAttention(E, H, dropout=1.0)


def test_prepare_mask_direct() -> None:
    """The canonical form: -inf where masked, dead rows reset to 0 and flagged."""
    keep = torch.tensor([[True, False], [False, False]])
    pm = bertattn.prepare_mask(
        keep, batch=1, heads=1, query_len=2, key_len=2, dtype=torch.float16, device=X.device
    )
    assert pm.bias.dtype == torch.float32  # scores of half inputs are made in float32
    assert pm.bias.tolist() == [[0.0, float("-inf")], [0.0, 0.0]]
    assert pm.live_rows.tolist() == [[True], [False]]
    empty = bertattn.prepare_mask(
        batch=1, heads=1, query_len=2, key_len=2, dtype=torch.float32, device=X.device
    )
    assert empty.is_empty
