"""Norms: LayerNorm with or without its bias (ModernBERT's have none), or RMSNorm."""

from __future__ import annotations

from torch import nn

__all__ = ["make_norm", "NORMS"]

#: the norm kinds :func:`make_norm` builds
NORMS = ("layer_norm", "rms_norm")


def make_norm(width: int, eps: float, *, bias: bool = True, kind: str = "layer_norm") -> nn.Module:
    """A norm over the last dimension of ``width``: ``layer_norm`` (mean and variance, a weight
    and, if ``bias``, a bias) or ``rms_norm`` (root mean square, a weight only)."""
    if kind == "layer_norm":
        return nn.LayerNorm(width, eps=eps, bias=bias)
    if kind == "rms_norm":
        if bias:
            raise ValueError("an RMSNorm has no bias; build it with bias=False.")
        return nn.RMSNorm(width, eps=eps)
    raise ValueError(f"unknown norm kind {kind!r}; valid kinds: {', '.join(NORMS)}.")
