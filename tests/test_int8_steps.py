"""The fused steps around a block's int8 feed-forward products (bertattn.encoder.int8_steps),
each compiled step against the same arithmetic written here with plain torch ops in float64:
the fused step may differ from float64 by no more than a few times what the same ops in
float32 differ by (float32's own error), and a quantized code by at most one level where the
value sits on a rounding edge."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertattn.encoder import int8_steps
from bertattn.encoder.int8_steps import QMIN, block_kernels, norm_parts

pytestmark = pytest.mark.slow  # each step compiles on its first call

M, E, INNER = 37, 48, 40
#: how many times float32's own error a fused step may be from float64
TIMES = 4.0


def _close(got: torch.Tensor, want64: torch.Tensor, want32: torch.Tensor) -> None:
    """``got`` within :data:`TIMES` float32's own distance from the float64 value."""
    own = float((want32.double() - want64).abs().max())
    apart = float((got.double() - want64).abs().max())
    assert own > 0.0  # the float32 reference rounds: the bar is not zero
    assert apart <= TIMES * own, (apart, own)


def _quantized(v: torch.Tensor, inv: torch.Tensor, levels: int) -> tuple[torch.Tensor, ...]:
    """Per-row asymmetric codes of ``v * inv`` (as int8 values from QMIN), scale, scale * zero."""
    xs = v * inv
    lo = xs.amin(-1, keepdim=True).clamp(max=0)
    hi = xs.amax(-1, keepdim=True).clamp(min=0)
    s = ((hi - lo) / levels).clamp(min=1e-12)
    z = torch.round(-lo / s) + QMIN
    return torch.round(xs / s + z).clamp(QMIN, QMIN + levels), s, s * z


def _codes_close(got: tuple[torch.Tensor, ...], v64: torch.Tensor, inv: torch.Tensor) -> None:
    """``got`` (u8 codes, s, sz) quantizes ``v64`` as float64 would, a code at most one level
    off (a value on a rounding edge) and few of them."""
    q, s, sz = got
    want_q, want_s, want_sz = _quantized(v64, inv.double(), 255)
    codes = q.to(torch.int64) - 128  # u8 codes are the int8 ones plus 128
    off = (codes - want_q).abs()
    assert int(off.max()) <= 1 and float((off > 0).double().mean()) < 0.01
    assert torch.allclose(s.double(), want_s, rtol=1e-5, atol=0)
    assert torch.allclose(sz.double(), want_sz, rtol=1e-5, atol=1e-6)


def _norms() -> dict[str, torch.nn.Module]:
    torch.manual_seed(1)
    ln = torch.nn.LayerNorm(E, eps=1e-12)
    rms = torch.nn.RMSNorm(E, eps=1e-6)
    with torch.no_grad():
        for p in (ln.weight, ln.bias, rms.weight):
            p.copy_(torch.randn(E) * 0.3 + (1.0 if p is not ln.bias else 0.0))
    ln.requires_grad_(False)  # as in inference: no autograd graph around the compiled steps
    rms.requires_grad_(False)
    return {"layer_norm": ln, "rms_norm": rms}


def _norm64(mod: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """``mod`` computed from its definition on ``h`` in ``h``'s dtype."""
    w = mod.weight.to(h.dtype)
    if isinstance(mod, torch.nn.LayerNorm):
        c = h - h.mean(-1, keepdim=True)
        return c / torch.sqrt((c * c).mean(-1, keepdim=True) + mod.eps) * w + mod.bias.to(h.dtype)
    return h / torch.sqrt((h * h).mean(-1, keepdim=True) + mod.eps) * w


@pytest.mark.parametrize("prenorm", [True, False])
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_residual_norm_quantize_is_the_add_the_norm_and_the_quantize(kind, prenorm) -> None:
    mod = _norms()[kind]
    torch.manual_seed(2)
    a, x = torch.randn(M, E) * 2, torch.randn(M, E)
    inv = torch.rand(E) + 0.5
    h, *q = block_kernels().residual_norm_quantize(a, x, norm_parts(mod), prenorm, inv, 255, True)
    for dtype in (torch.float64, torch.float32):
        s = x.to(dtype) + a.to(dtype)
        n = _norm64(mod, s)
        if dtype == torch.float64:
            h64, n64 = (s, n) if prenorm else (n, n)
        else:
            h32 = s if prenorm else n
    _close(h, h64, h32)
    _codes_close(tuple(q), n64, inv)


@pytest.mark.parametrize("act", [F.gelu, F.silu])
@pytest.mark.parametrize("gated", [True, False])
def test_dequantize_act_is_the_dequantize_the_activation_and_the_gate(act, gated) -> None:
    torch.manual_seed(3)
    width = 2 * INNER if gated else INNER
    y, bias, col = torch.randn(M, width) * 50, torch.randn(width), torch.randn(width)
    s, sz = torch.rand(M, 1) * 0.05, torch.randn(M, 1) * 0.1
    got = block_kernels().dequantize_act(y, s, sz, bias, col, act, gated)
    assert got.shape == (M, INNER)
    want = {}
    for dtype in (torch.float64, torch.float32):
        u = y.to(dtype) * s.to(dtype) - sz.to(dtype) * col.to(dtype) + bias.to(dtype)
        want[dtype] = act(u[:, :INNER]) * u[:, INNER:] if gated else act(u)
    _close(got, want[torch.float64], want[torch.float32])


@pytest.mark.parametrize("post", [None, "layer_norm", "rms_norm"])
def test_dequantize_residual_norm_is_the_dequantize_the_add_and_the_norm(post) -> None:
    mod = None if post is None else _norms()[post]
    torch.manual_seed(4)
    y, bias, col = torch.randn(M, E) * 50, torch.randn(E), torch.randn(E)
    s, sz = torch.rand(M, 1) * 0.05, torch.randn(M, 1) * 0.1
    h = torch.randn(M, E)
    norm = None if mod is None else norm_parts(mod)
    got = block_kernels().dequantize_residual_norm(y, s, sz, bias, col, h, norm)
    want = {}
    for dtype in (torch.float64, torch.float32):
        u = y.to(dtype) * s.to(dtype) - sz.to(dtype) * col.to(dtype) + bias.to(dtype)
        out = h.to(dtype) + u
        want[dtype] = out if mod is None else _norm64(mod, out)
    _close(got, want[torch.float64], want[torch.float32])


def test_a_norm_of_another_kind_is_named_not_fused() -> None:
    assert norm_parts(torch.nn.Identity()) == "a Identity norm"
    assert norm_parts(torch.nn.LayerNorm((4, 8))) == "a LayerNorm norm"
    ln = torch.nn.LayerNorm(8, bias=False)
    assert norm_parts(ln) == ("layer_norm", ln.weight, None, ln.eps)


def test_the_steps_compile_once_for_every_number_of_rows() -> None:
    """Dynamic in the rows, static in the widths: a new batch size compiles nothing."""
    import torch._dynamo.utils as dynamo_utils

    kern = int8_steps.block_kernels()
    inv = torch.rand(E) + 0.5
    kern.quantize(torch.randn(M, E), inv, 255, True)
    kern.quantize(torch.randn(M + 3, E), inv, 255, True)
    before = dynamo_utils.counters["stats"]["unique_graphs"]
    for rows in (5, 64, 300):
        kern.quantize(torch.randn(rows, E), inv, 255, True)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == before
