"""Property tests: any small shape, dtype and mask (fully masked rows included).

Tolerances: float32 against math with a documented absolute 1e-5 (rounding of head_dim <= 8
sums of O(1) terms); bf16 / fp16 by the relative rule: a backend's error against a float64
reference of the same values is at most 2x the error of the plain low-precision path (math in
the same dtype), plus one rounding unit: err(backend) <= 2 * err(math) + ulp, where
ulp = finfo(dtype).eps * max|ref| is one rounding unit of the result: on these tiny shapes
math's error is often a half-ulp (correctly rounded), and any other summation order is then a
whole ulp away.
"""

from __future__ import annotations

import torch
from attention_helpers import (
    DTYPES,
    backend_names,
    max_err,
    padded_backends,
    returns_weights,
    upcast,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import bertattn

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def problems(draw):
    batch = draw(st.integers(1, 3))
    lq = draw(st.integers(1, 9))
    cross = draw(st.booleans())
    lk = draw(st.integers(1, 9)) if cross else lq
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 8))
    dtype = draw(st.sampled_from(DTYPES))
    mask_form = draw(st.sampled_from(["none", "mask4d", "mask2d", "padding", "both"]))
    seed = draw(st.integers(0, 2**16))
    p_keep = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))  # 0.0: every row fully masked
    return batch, lq, lk, cross, heads, head_dim, dtype, mask_form, seed, p_keep


def _build(problem):
    batch, lq, lk, cross, heads, head_dim, dtype, mask_form, seed, p_keep = problem
    g = torch.Generator().manual_seed(seed)
    e = heads * head_dim
    torch.manual_seed(seed)
    m = bertattn.MultiHeadAttention(e, heads).eval()
    x = torch.randn(batch, lq, e, generator=g)
    kw = {}
    if cross:
        kw["key_value"] = torch.randn(batch, lk, e, generator=g).to(dtype)
    if mask_form in ("mask4d", "both"):
        kw["mask"] = torch.rand(batch, 1, lq, lk, generator=g) < p_keep
    if mask_form == "mask2d":
        kw["mask"] = torch.rand(lq, lk, generator=g) < p_keep
    if mask_form in ("padding", "both"):
        kw["key_padding_mask"] = torch.rand(batch, lk, generator=g) < p_keep
    return m.to(dtype), x.to(dtype), kw, dtype


def _dead(kw, batch, lq, lk):
    keep = torch.ones(batch, 1, lq, lk, dtype=torch.bool)
    if "mask" in kw:
        keep = keep & kw["mask"]
    if "key_padding_mask" in kw:
        keep = keep & kw["key_padding_mask"][:, None, None, :]
    return ~keep.any(-1)[:, 0]  # (B, Lq)


@SETTINGS
@given(problems())
def test_backends_agree_with_math_and_never_nan(problem) -> None:
    m, x, kw, dtype = _build(problem)
    batch, lq, lk = problem[0], problem[1], problem[2]
    with torch.no_grad():
        m.backend = "math"
        math_out, math_w = m(x, **kw)
        ref_kw = {k: (v.double() if v.is_floating_point() else v) for k, v in kw.items()}
        ref_out, ref_w = upcast(m)(x.double(), **ref_kw)
        assert math_out.shape == x.shape and math_w.shape == (batch, m.num_heads, lq, lk)
        assert not torch.isnan(math_out).any() and not torch.isnan(math_w).any()
        dead = _dead(kw, batch, lq, lk)
        assert (math_w.transpose(1, 2)[dead] == 0).all()
        torch.testing.assert_close(
            math_out[dead], m.out_linear.bias.expand(int(dead.sum()), -1), atol=0, rtol=0
        )
        base = max_err(math_out, ref_out)
        for backend in backend_names():
            m.backend = backend
            need = returns_weights(backend)
            out, w = m(x, need_weights=need, **kw)
            assert not torch.isnan(out).any(), backend
            if dtype == torch.float32:
                torch.testing.assert_close(out, math_out, atol=1e-5, rtol=0)
                if need:
                    torch.testing.assert_close(w, math_w, atol=1e-5, rtol=0)
            else:
                ulp = torch.finfo(dtype).eps * max(ref_out.abs().max().item(), 1e-3)
                assert max_err(out, ref_out) <= 2 * base + ulp, backend
                if need:  # weights are <= 1
                    ulp_w = torch.finfo(dtype).eps
                    assert max_err(w, ref_w) <= 2 * max_err(math_w, ref_w) + ulp_w, backend


@settings(max_examples=30, deadline=None, derandomize=True)
@given(problems())
def test_backward_is_finite_everywhere(problem) -> None:
    m, x, kw, dtype = _build(problem)
    for backend in padded_backends():
        m.backend = backend
        m.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        out, _ = m(xg, need_weights=False, **kw)
        out.float().square().sum().backward()
        assert torch.isfinite(xg.grad).all(), backend
        assert all(torch.isfinite(p.grad).all() for p in m.parameters()), backend
