"""``mask`` and ``attn_bias`` of every broadcastable shape, 0-D to 4-D, on every backend.

Both are documented as broadcastable to ``(B, H, Lq, Lk)``; ``math`` adds the bias to the
scores and so takes any of those shapes. Every other padded backend must give math's result
(float32, absolute 1e-5 as in test_attention_properties.py); ``varlen`` takes a key padding
mask only and must refuse a mask or bias with its ValueError, whatever the shape. A shape that
cannot broadcast is a ValueError naming the shape that came and the one expected, everywhere.
"""

from __future__ import annotations

import re

import pytest
import torch
from attention_helpers import backend_names, random_module, returns_weights
from hypothesis import given, settings
from hypothesis import strategies as st

import bertattn

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
ATOL_OUT = 1e-5  # head_dim <= 4 sums of O(1) terms, as in test_attention_properties.py
ATOL_W = 1e-6
VARLEN_REFUSAL = "takes self-attention with key_padding_mask only"


def all_backends() -> list[str]:
    """Every registered backend (packed ones included), then ``auto``."""
    return [*bertattn.BACKENDS, "auto"]


def is_packed(backend: str) -> bool:
    return backend != "auto" and bertattn.BACKENDS[backend].layout == "packed"


def broadcast_shapes(full: tuple[int, int, int, int]):
    """A shape broadcastable to ``full``: each dim full or 1, 0 to 4 leading dims dropped."""
    dims = st.tuples(*(st.sampled_from(sorted({n, 1})) for n in full))
    return st.tuples(dims, st.integers(0, 4)).map(lambda d: d[0][d[1] :])


@st.composite
def problems(draw):
    unbatched = draw(st.booleans())
    batch = 1 if unbatched else draw(st.integers(1, 3))
    heads = draw(st.integers(1, 3))
    lq = draw(st.integers(1, 5))
    cross = draw(st.booleans())
    lk = draw(st.integers(1, 5)) if cross else lq
    head_dim = draw(st.integers(1, 4))
    full = (batch, heads, lq, lk)
    mask_shape = draw(st.none() | broadcast_shapes(full))
    bias_shape = draw(st.none() | broadcast_shapes(full))
    padding = draw(st.booleans())
    p_keep = draw(st.sampled_from([0.0, 0.5, 1.0]))  # 0.0: every row masked by the mask
    p_neg_inf = draw(st.sampled_from([0.0, 0.3]))  # -inf bias entries: dead rows from the bias
    seed = draw(st.integers(0, 2**16))
    return {
        "unbatched": unbatched,
        "full": full,
        "cross": cross,
        "head_dim": head_dim,
        "mask_shape": mask_shape,
        "bias_shape": bias_shape,
        "padding": padding,
        "p_keep": p_keep,
        "p_neg_inf": p_neg_inf,
        "seed": seed,
    }


def _build(p: dict) -> tuple[bertattn.MultiHeadAttention, torch.Tensor, dict]:
    batch, heads, lq, lk = p["full"]
    e = heads * p["head_dim"]
    g = torch.Generator().manual_seed(p["seed"])
    m = random_module(e, heads, seed=p["seed"])
    lead = () if p["unbatched"] else (batch,)
    x = torch.randn(*lead, lq, e, generator=g)
    kw: dict = {}
    if p["cross"]:
        kw["key_value"] = torch.randn(*lead, lk, e, generator=g)
    if p["mask_shape"] is not None:
        kw["mask"] = torch.rand(p["mask_shape"], generator=g) < p["p_keep"]
    if p["bias_shape"] is not None:
        bias = torch.randn(p["bias_shape"], generator=g)
        drop = torch.rand(p["bias_shape"], generator=g) < p["p_neg_inf"]
        kw["attn_bias"] = bias.masked_fill(drop, float("-inf"))
    if p["padding"]:
        kw["key_padding_mask"] = torch.rand(*lead, lk, generator=g) < 0.7
    return m, x, kw


def _dead_rows(p: dict, kw: dict) -> torch.Tensor:
    """(B, H, Lq) True where a query row has no key left, by broadcasting by hand."""
    batch, heads, lq, lk = p["full"]
    keep = torch.ones(batch, heads, lq, lk, dtype=torch.bool)
    if "mask" in kw:
        keep = keep & kw["mask"]
    if "attn_bias" in kw:
        keep = keep & (kw["attn_bias"] != float("-inf"))
    if "key_padding_mask" in kw:
        keep = keep & kw["key_padding_mask"].reshape(batch, 1, 1, lk)
    return ~keep.any(-1)


@SETTINGS
@given(problems())
def test_every_broadcastable_mask_and_bias_equals_math_on_every_backend(p) -> None:
    m, x, kw = _build(p)
    batch, heads, lq, lk = p["full"]
    with torch.no_grad():
        m.backend = "math"
        ref, ref_w = m(x, **kw)
        lead = () if p["unbatched"] else (batch,)
        assert ref.shape == x.shape and ref_w.shape == (*lead, heads, lq, lk)
        assert torch.isfinite(ref).all() and torch.isfinite(ref_w).all()
        dead = _dead_rows(p, kw)  # (B, H, Lq)
        assert (ref_w.reshape(batch, heads, lq, lk)[dead] == 0).all()
        for backend in all_backends():
            m.backend = backend
            if is_packed(backend):
                _check_packed(m, x, kw, ref)
                continue
            need = returns_weights(backend)
            out, w = m(x, need_weights=need, **kw)
            torch.testing.assert_close(out, ref, atol=ATOL_OUT, rtol=0, msg=backend)
            if need:
                torch.testing.assert_close(w, ref_w, atol=ATOL_W, rtol=0, msg=backend)
            else:
                assert w is None


def _check_packed(m: bertattn.MultiHeadAttention, x: torch.Tensor, kw: dict, ref) -> None:
    """varlen: math's result on real tokens without mask / bias; its refusal otherwise."""
    others = [k for k in ("mask", "attn_bias", "key_value") if k in kw]
    if others:
        with pytest.raises(ValueError, match=f"{VARLEN_REFUSAL}, got {others[0]}"):
            m(x, need_weights=False, **kw)
        return
    out, w = m(x, need_weights=False, **kw)
    assert w is None
    real = kw.get("key_padding_mask", torch.ones(x.shape[:-1], dtype=torch.bool))
    torch.testing.assert_close(out[real], ref[real], atol=ATOL_OUT, rtol=0)
    assert (out[~real] == 0).all()


# ---------------------------------------------------------------------------- the reported bug
B, H, LQ, LK, E = 2, 2, 3, 4, 8
LOW_RANK = {
    "0-D": (),
    "(1,)": (1,),
    "(Lk,)": (LK,),
}


def _low_rank(kind: str, shape: tuple[int, ...], value: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(shape) + 7 * len(kind))
    if kind == "mask":
        if value == "all":
            return torch.ones(shape, dtype=torch.bool)
        if value == "none":
            return torch.zeros(shape, dtype=torch.bool)
        keep = torch.rand(shape, generator=g) < 0.5
        keep.view(-1)[0] = True  # at least one key to attend to
        return keep
    if value == "none":
        return torch.full(shape, float("-inf"))
    return torch.randn(shape, generator=g)


@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
@pytest.mark.parametrize("padding", [False, True], ids=["", "kpm"])
@pytest.mark.parametrize("shape_name", list(LOW_RANK))
@pytest.mark.parametrize("kind", ["mask", "attn_bias"])
@pytest.mark.parametrize("backend", ["sdpa", "varlen", "auto"])
def test_0d_and_1d_mask_and_bias(backend, kind, shape_name, padding, unbatched) -> None:
    """The report: ``backend="sdpa"`` raised IndexError for a 0-D or 1-D mask / attn_bias."""
    m = random_module(E, H)
    lead = () if unbatched else (B,)
    x = torch.randn(*lead, LQ, E, generator=torch.Generator().manual_seed(0))
    kv = torch.randn(*lead, LK, E, generator=torch.Generator().manual_seed(1))
    kw = {"key_value": kv, kind: _low_rank(kind, LOW_RANK[shape_name], "some")}
    if padding:
        kpm = torch.ones(*lead, LK, dtype=torch.bool)
        kpm[..., -1] = False
        kw["key_padding_mask"] = kpm
    with torch.no_grad():
        m.backend = "math"
        ref, _ = m(x, **kw)
        m.backend = backend
        if is_packed(backend):
            with pytest.raises(ValueError, match=VARLEN_REFUSAL):
                m(x, need_weights=False, **kw)
            return
        out, w = m(x, need_weights=False, **kw)
    assert w is None and out.shape == x.shape
    torch.testing.assert_close(out, ref, atol=ATOL_OUT, rtol=0)


@pytest.mark.parametrize("shape_name", list(LOW_RANK))
@pytest.mark.parametrize("kind", ["mask", "attn_bias"])
@pytest.mark.parametrize("backend", backend_names())
def test_0d_and_1d_that_mask_every_key_give_zero_rows(backend, kind, shape_name) -> None:
    """False everywhere (mask) or -inf everywhere (bias): zero weights, zero context."""
    m = random_module(E, H)
    m.backend = backend
    x, kv = torch.randn(B, LQ, E), torch.randn(B, LK, E)
    kw = {"key_value": kv, kind: _low_rank(kind, LOW_RANK[shape_name], "none")}
    need = returns_weights(backend)
    with torch.no_grad():
        out, w = m(x, need_weights=need, **kw)
    torch.testing.assert_close(out, m.out_linear.bias.expand(B, LQ, E), atol=0, rtol=0)
    if need:
        assert w.shape == (B, H, LQ, LK) and (w == 0).all()


# ---------------------------------------------------------------------------- not broadcastable
NOT_BROADCASTABLE = [
    ("mask", (LK + 1,), "(5)"),
    ("mask", (LQ + 1, LK), "(4, 4)"),
    ("mask", (B, H + 1, 1, 1), "(2, 3, 1, 1)"),
    ("mask", (B + 1, 1, 1), "(3, 1, 1)"),
    ("attn_bias", (2,), "(2)"),
    ("attn_bias", (LQ, LK + 2), "(3, 6)"),
    ("attn_bias", (B + 1, 1, LQ, LK), "(3, 1, 3, 4)"),
]


@pytest.mark.parametrize("backend", all_backends())
@pytest.mark.parametrize(
    "kind, shape, shown", NOT_BROADCASTABLE, ids=[f"{c[0]}{c[1]}" for c in NOT_BROADCASTABLE]
)
def test_not_broadcastable_is_a_value_error_that_says_what_to_do(
    backend, kind, shape, shown
) -> None:
    m = random_module(E, H)
    m.backend = backend
    x = torch.randn(B, LQ, E)
    kv = torch.randn(B, LK, E)
    value = torch.ones(shape, dtype=torch.bool) if kind == "mask" else torch.zeros(shape)
    expected = re.escape(
        f"{kind} of shape {shown} cannot broadcast to (batch, heads, query_len, key_len) "
        f"= ({B}, {H}, {LQ}, {LK}). Give it a shape such as ({LQ}, {LK}), "
    )
    with pytest.raises(ValueError, match=expected):
        m(x, key_value=kv, need_weights=False, **{kind: value})
