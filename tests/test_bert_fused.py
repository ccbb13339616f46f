"""The fused bias + GELU product (bertattn.attention.fused) against the plain ops, and where it
must not run."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from bertattn import BertModel
from bertattn.attention import fused

BF16 = torch.bfloat16

#: oneDNN has bfloat16 kernels only with AVX-512 (or newer); on an AVX2 CPU the op cannot be built
BF16_KERNELS = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
needs_bf16_kernels = pytest.mark.skipif(
    not BF16_KERNELS,
    reason="oneDNN has no bfloat16 kernels on this CPU (no AVX-512): the fused op steps aside, "
    "as test_steps_aside_where_onednn_has_no_bf16_kernels checks",
)


@pytest.fixture(autouse=True)
def _fresh_check():
    """Each test sees the first-use check afresh, and leaves no verdict behind."""
    saved = dict(fused._checked)
    fused._checked.clear()
    yield
    fused._checked.clear()
    fused._checked.update(saved)


def _inputs(rows=(3, 7), k=48, n=80, dtype=BF16):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(*rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.2).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, b


@needs_bf16_kernels
@pytest.mark.parametrize("bias", [True, False])
def test_matches_plain_ops_in_bfloat16(bias):
    x, w, b = _inputs()
    b = b if bias else None
    with torch.inference_mode():
        got = fused.linear_gelu(x, w, b)
        plain = F.gelu(F.linear(x, w, b))  # bf16 product, rounded, then GELU, rounded
    exact = F.gelu(F.linear(x.double(), w.double(), None if b is None else b.double()))
    assert got is not None and got.dtype == BF16 and got.shape == (3, 7, 80)
    # one rounding of the output to bf16 (2^-8 relative), against two for the plain ops
    err_fused = ((got.double() - exact).abs() / (exact.abs() + 1e-2)).max().item()
    err_plain = ((plain.double() - exact).abs() / (exact.abs() + 1e-2)).max().item()
    assert err_fused <= max(err_plain, 2**-8)


def test_not_used_where_it_must_not_be(mkl_products):
    x, w, b = _inputs()
    with torch.inference_mode():
        # float32 with MKL's products: plain (with oneDNN's, see test_gemm.py)
        assert fused.linear_gelu(x.float(), w.float(), b.float()) is None
        assert fused.linear_gelu(x, w.float(), b) is None  # mixed dtypes
        assert fused.linear_gelu(x, w, b.float()) is None
    with torch.enable_grad():
        assert fused.linear_gelu(x, w, b) is None  # no backward for the op


def test_missing_or_wrong_op_falls_back(monkeypatch, caplog):
    x, w, b = _inputs()

    def broken(*args):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(fused, "_op", lambda: broken)
    with caplog.at_level(logging.INFO, logger="bertattn.attention.fused"), torch.inference_mode():
        assert fused.linear_gelu(x, w, b) is None
        assert fused.linear_gelu(x, w, b) is None  # decided once
    assert "unavailable" in caplog.text and fused._checked[BF16] is False
    fused._checked.clear()
    monkeypatch.setattr(fused, "_op", lambda: lambda x, w, b, *rest: F.relu(F.linear(x, w, b)))
    with torch.inference_mode():
        assert fused.linear_gelu(x, w, b) is None  # a kernel that computes something else


@pytest.mark.skipif(BF16_KERNELS, reason="oneDNN has bfloat16 kernels on this CPU")
def test_steps_aside_where_onednn_has_no_bf16_kernels(caplog):
    """The real op on a CPU without them: the first-use check fails, is logged, and the plain
    ops run from then on."""
    x, w, b = _inputs()
    with caplog.at_level(logging.INFO, logger="bertattn.attention.fused"), torch.inference_mode():
        assert fused.linear_gelu(x, w, b) is None
    assert fused._checked[BF16] is False and "unavailable" in caplog.text


@needs_bf16_kernels
def test_bf16_model_runs_it_and_matches_the_plain_path(tiny_checkpoint):
    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    model.to_compute_dtype(BF16)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 99, (4, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0
    calls = []
    real = fused.linear_gelu

    def spy(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    with torch.inference_mode():
        fused._checked[BF16] = False  # the plain ops
        plain = model(ids, mask).last_hidden_state
        fused._checked.clear()
        try:
            fused.linear_gelu = spy
            got = model(ids, mask).last_hidden_state
        finally:
            fused.linear_gelu = real
        f32 = BertModel.from_pretrained(tiny_checkpoint).eval()(ids, mask).last_hidden_state
    assert calls and all(calls)  # every layer's MLP took it
    keep = mask.bool()
    # both bf16 paths are as far from float32 as each other (bf16 rounding), and close together
    err_got = (got[keep] - f32[keep]).abs().max().item()
    err_plain = (plain[keep] - f32[keep]).abs().max().item()
    assert err_got <= 2 * err_plain + 1e-3
    torch.testing.assert_close(got[keep], plain[keep], atol=4 * err_plain + 1e-3, rtol=0)
