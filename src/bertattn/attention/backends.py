"""Attention backends: a registry of plain functions with one signature.

Each backend takes per-head queries, keys and values and a canonical additive bias and returns
``(context, weights | None)``::

    fn(q, k, v, bias, *, dropout_p, need_weights) -> (context, weights)
        q:       (B, H, Lq, D)
        k, v:    (B, H, Lk, D)
        bias:    (B|1, H|1, Lq|1, Lk) additive float, or None   (see masks.prepare_mask)
        context: (B, H, Lq, D)
        weights: (B, H, Lq, Lk) or None

Backends never see a query row made only of ``-inf``: :mod:`bertattn.attention.masks` resets
such rows and the module zeroes them afterwards, identically for every backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import score_dtype

__all__ = ["AttentionBackend", "BackendSpec", "BACKENDS", "register_backend", "get_backend"]


class AttentionBackend(Protocol):
    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        *,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]: ...


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend and what it can do (used by ``auto`` and by error messages)."""

    name: str
    fn: AttentionBackend
    returns_weights: bool
    memory: str
    description: str


def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    *,
    dropout_p: float,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """The reference: the article's steps, written out. Softmax in float32 for half inputs."""
    d = q.size(-1)
    # the article: scores = Q K^T / sqrt(d_k)                       # (B, H, Lq, Lk)
    scores = torch.matmul(q, k.transpose(-2, -1)).to(score_dtype(q.dtype)) / math.sqrt(d)
    # the article: masked_fill(mask == 0, -1e9); here an additive -inf bias (fits every dtype)
    if bias is not None:
        scores = scores + bias
    # the article: softmax over the keys, then dropout on the probabilities
    weights = torch.softmax(scores, dim=-1).to(q.dtype)  # (B, H, Lq, Lk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    # the article: context = attention @ V                         # (B, H, Lq, D)
    context = torch.matmul(weights, v)
    return context, (weights if need_weights else None)


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    *,
    dropout_p: float,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """Fused ``torch.nn.functional.scaled_dot_product_attention``: O(L) memory, no weights."""
    if need_weights:
        raise ValueError(
            "backend 'sdpa' does not return attention weights; pass need_weights=False, "
            "or use backend='math' (or 'auto', which picks math when weights are needed)."
        )
    if bias is not None and bias.dtype != q.dtype:
        bias = bias.to(q.dtype)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    return context, None


BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> None:
    """Add a backend to the registry (a later registration of the same name replaces it)."""
    BACKENDS[spec.name] = spec


def get_backend(name: str) -> BackendSpec:
    """The registered backend called ``name``; a clear error lists the valid names."""
    try:
        return BACKENDS[name]
    except KeyError:
        valid = ", ".join(sorted([*BACKENDS, "auto"]))
        raise ValueError(f"unknown attention backend {name!r}; valid names: {valid}.") from None


register_backend(
    BackendSpec(
        "math", math_attention, True, "O(L^2)", "the article's steps; returns attention weights"
    )
)
register_backend(
    BackendSpec("sdpa", sdpa_attention, False, "O(L)", "torch scaled_dot_product_attention (fused)")
)
