"""The small steps around an int8 product, as plain torch code that ``torch.compile`` fuses:
per-token quantize, dequantize, and the fused steps of a block's feed-forward half
(:mod:`bertattn.encoder.int8_blocks`).

``levels``: 255 for 8 bits; a token's int8 values are ``round(x / s) + z`` in
``[QMIN, QMIN + levels]``, ``s * (q - z)`` its dequantized value; ``sz`` is ``s * z``, what the
zero-point correction needs after the product. With fewer than 8 bits the values start at -128
too: as u8 bytes they are ``0..levels``, what 7-bit activations need to keep a pair's sum exact
(:func:`~bertattn.encoder.int8_forms.gelu_form`).

A block's feed-forward half runs as three of them, each one fused kernel (``M`` rows, width
``E``, inner width ``I``; a norm is ``(kind, weight, bias, eps)``, :func:`norm_parts`):

* :func:`residual_norm_quantize`: the attention output ``(M, E)`` plus the residual, the
  block's norm, and the quantize of the first feed-forward product's input;
* :func:`dequantize_act`: that product's ``(M, I)`` or gated ``(M, 2I)`` output dequantized,
  the activation (times the gate), written ``(M, I)``; then :func:`quantize` for the second
  product (one kernel instead would compute the activation twice, once for each row's range
  and once for its codes: measured slower);
* :func:`dequantize_residual_norm`: the second product's ``(M, E)`` output dequantized, plus
  the residual, and the post-norm block's last norm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks.norms import OffsetRMSNorm

__all__ = [
    "QMIN",
    "BlockKernels",
    "Norm",
    "block_kernels",
    "codes",
    "compiled",
    "dequantize",
    "dequantize_act",
    "dequantize_residual_norm",
    "norm_parts",
    "normed",
    "quantize",
    "residual_norm_quantize",
]

QMIN = -128

#: a norm as the fused steps take it: ``(kind, weight, bias, eps)``, kind ``"layer_norm"`` or
#: ``"rms_norm"`` (weight and bias ``(E,)`` or None); ``None``: no norm
Norm = tuple[str, Tensor | None, Tensor | None, float | None] | None


def codes(q: Tensor, unsigned: bool) -> Tensor:
    """The rounded, clamped values ``q`` (in ``[-128, 127]``) as the product takes them: int8,
    or uint8 plus 128 (:mod:`bertattn.encoder.int8_forms`: called with a zero point of 128)."""
    return (q + 128.0).to(torch.uint8) if unsigned else q.to(torch.int8)


def quantize(
    x: Tensor, inv: Tensor, levels: int, unsigned: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token asymmetric int8 of ``x * inv`` (``inv``: the smoothing divisors, inverted),
    its values in ``[QMIN, QMIN + levels]``: ``(M, K)`` -> codes ``(M, K)``, ``s`` and ``sz``
    ``(M, 1)``."""
    qmin = QMIN
    xs = x * inv
    lo = xs.amin(-1, keepdim=True).clamp(max=0.0)
    hi = xs.amax(-1, keepdim=True).clamp(min=0.0)
    s = ((hi - lo) / levels).clamp(min=1e-12)
    z = torch.round(-lo / s) + qmin
    q = codes(torch.round(xs / s + z).clamp(qmin, qmin + levels), unsigned)
    return q, s, s * z


def dequantize(
    y: Tensor, s: Tensor, sz: Tensor, bias: Tensor, col: Tensor, out: torch.dtype = torch.float32
) -> Tensor:
    """The output of a product ``y = (q @ wq.T) * sw`` of per-token quantized rows, computed
    in float32 and written in ``out``: ``s * y - s * z * col + bias`` (``col``: each weight
    row's sum, times its scale)."""
    return (y.float() * s - sz * col + bias).to(out)


def normed(h: Tensor, norm: Norm) -> Tensor:
    """``h`` ``(..., E)`` through ``norm`` (None: ``h`` itself)."""
    if norm is None:
        return h
    kind, weight, bias, eps = norm
    if kind == "layer_norm":
        return F.layer_norm(h, (h.shape[-1],), weight, bias, 1e-5 if eps is None else eps)
    return F.rms_norm(h, (h.shape[-1],), weight, eps)


def norm_parts(mod: nn.Module) -> Norm | str:
    """``mod`` (a block's norm) as :data:`Norm`; a string saying why not where it is of a
    kind the fused steps do not compute (they compute ``nn.LayerNorm``, ``nn.RMSNorm`` and
    :class:`~bertattn.blocks.norms.OffsetRMSNorm` over the last dimension)."""
    if type(mod) is nn.LayerNorm and len(mod.normalized_shape) == 1:
        return "layer_norm", mod.weight, mod.bias, mod.eps
    if type(mod) is nn.RMSNorm and len(mod.normalized_shape) == 1:
        return "rms_norm", mod.weight, None, mod.eps
    if type(mod) is OffsetRMSNorm:
        return "rms_norm", 1.0 + mod.weight.float(), None, mod.eps
    return f"a {type(mod).__name__} norm"


def residual_norm_quantize(
    a: Tensor, x: Tensor, norm: Norm, prenorm: bool, inv: Tensor, levels: int, unsigned: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The attention's output ``a`` and the residual ``x`` ``(M, E)`` -> the residual stream
    ``h`` ``(M, E)`` and the quantized input of the first feed-forward product (codes, ``s``,
    ``sz``). Pre-norm: ``h = x + a``, the input ``norm(h)``; post-norm: ``h = norm(x + a)``,
    the input ``h``."""
    h = x + a
    if prenorm:
        return (h, *quantize(normed(h, norm), inv, levels, unsigned))
    h = normed(h, norm)
    return (h, *quantize(h, inv, levels, unsigned))


def dequantize_act(
    y: Tensor,
    s: Tensor,
    sz: Tensor,
    bias: Tensor,
    col: Tensor,
    act: Callable[[Tensor], Tensor],
    gated: bool,
) -> Tensor:
    """The first feed-forward product's output ``y`` ``(M, I)`` (gated: ``(M, 2I)``, the
    activated half first) -> ``act(u)`` (gated: ``act(u[:, :I]) * u[:, I:]``) ``(M, I)`` of
    its dequantized value ``u``."""
    if not gated:
        return act(dequantize(y, s, sz, bias, col))
    i = y.shape[-1] // 2  # each half dequantized on its own: the (M, 2I) floats never stored
    a = dequantize(y[:, :i], s, sz, bias[:i], col[:i])
    return act(a) * dequantize(y[:, i:], s, sz, bias[i:], col[i:])


def dequantize_residual_norm(
    y: Tensor, s: Tensor, sz: Tensor, bias: Tensor, col: Tensor, h: Tensor, norm: Norm
) -> Tensor:
    """The second feed-forward product's output ``y`` ``(M, E)`` dequantized, plus the residual
    ``h`` ``(M, E)``, through ``norm`` (the post-norm block's last; None for pre-norm)."""
    return normed(h + dequantize(y, s, sz, bias, col), norm)


@dataclass(frozen=True)
class BlockKernels:
    """The steps of a block's feed-forward half, compiled (:func:`compiled`)."""

    residual_norm_quantize: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
    dequantize_act: Callable[..., Tensor]
    quantize: Callable[..., tuple[Tensor, Tensor, Tensor]]
    dequantize_residual_norm: Callable[..., Tensor]


def compiled(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn`` compiled by ``torch.compile`` (inductor's C++ backend), dynamic in the number of
    rows only: the first dimension of every 2-D tensor argument is marked dynamic on each
    call, the widths stay static, so one graph serves every batch and its loops are compiled
    for the model's widths (a LayerNorm step over 512 x 768 rows took 0.9 ms so, 1.6 ms with
    every size dynamic). A model of other widths in the same process compiles once more,
    with its widths dynamic from then on."""
    graph = torch.compile(fn, dynamic=None, fullgraph=True)

    def call(*args: object) -> object:
        for a in args:
            if isinstance(a, Tensor) and a.dim() == 2:
                torch._dynamo.maybe_mark_dynamic(a, 0)
        return graph(*args)

    return call


@functools.cache
def block_kernels() -> BlockKernels:
    """:class:`BlockKernels`, compiled on first use (:func:`compiled`)."""
    return BlockKernels(
        compiled(residual_norm_quantize),  # type: ignore[arg-type]
        compiled(dequantize_act),  # type: ignore[arg-type]
        compiled(quantize),  # type: ignore[arg-type]
        compiled(dequantize_residual_norm),  # type: ignore[arg-type]
    )
