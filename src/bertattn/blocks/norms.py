"""Norms: LayerNorm with or without its bias (ModernBERT's have none), RMSNorm, or Gemma's
RMSNorm, whose weight is stored as an offset from 1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NORMS", "OffsetRMSNorm", "make_norm"]

#: the norm kinds :func:`make_norm` builds
NORMS = ("layer_norm", "rms_norm", "offset_rms_norm")


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm over the last dimension of ``width``: ``x / rms(x) * (1 + weight)``,
    computed in float32 and returned in ``x``'s dtype; ``(..., width) -> (..., width)``. The
    weight is the checkpoint's, an offset from 1 (zeros: the identity scale), so it loads
    unchanged."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor) -> Tensor:
        scale = 1.0 + self.weight.float()  # (width,), in float32 whatever the weight's dtype
        return F.rms_norm(x.float(), scale.shape, scale, self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset=1"


def make_norm(width: int, eps: float, *, bias: bool = True, kind: str = "layer_norm") -> nn.Module:
    """A norm over the last dimension of ``width``: ``layer_norm`` (mean and variance, a weight
    and, if ``bias``, a bias), ``rms_norm`` (root mean square, a weight only) or
    ``offset_rms_norm`` (Gemma's: root mean square, a weight stored as an offset from 1)."""
    if kind == "layer_norm":
        return nn.LayerNorm(width, eps=eps, bias=bias)
    if kind == "rms_norm":
        if bias:
            raise ValueError("an RMSNorm has no bias; build it with bias=False.")
        return nn.RMSNorm(width, eps=eps)
    if kind == "offset_rms_norm":
        if bias:
            raise ValueError("an RMSNorm has no bias; build it with bias=False.")
        return OffsetRMSNorm(width, eps)
    raise ValueError(f"unknown norm kind {kind!r}; valid kinds: {', '.join(NORMS)}.")
