"""Disentangled attention (DeBERTa-v2 / v3): scores that also depend on relative position.

DeBERTa keeps the content of a token and its position apart. A table of ``2S`` relative
position embeddings ``P`` (shared by every layer, ``S`` the span) is projected by each layer
into position keys ``Pk`` and position queries ``Pq`` (with the layer's own key and query
projections when ``share_att_key``, DeBERTa-v3's choice, else with ``pos_key_proj`` /
``pos_query_proj``). The article's score gets two more terms::

    score(i, j) = ( q_i . k_j                  content-to-content (the article's)
                  + q_i . Pk[r(i, j)]          content-to-position  (c2p)
                  + k_j . Pq[r'(i, j)] )       position-to-content  (p2c)
                  / sqrt(D * (1 + #terms))

where ``r(i, j) = clamp(bucket(i - j) + S, 0, 2S - 1)`` indexes the table by how far key ``j``
is from query ``i`` and ``r'(i, j) = clamp(-bucket(j - i) + S, 0, 2S - 1)`` the same seen from
key ``j``. ``bucket`` keeps distances below ``buckets / 2`` as they are and puts longer ones in
logarithmically wider buckets up to ``max_position`` (:func:`relative_buckets`).

Shapes (B batch, H heads, L length, D head size, S span)::

    embeddings  (2S, E)     the table, after the model's norm of it
    pos_q, pos_k (H, 2S, D) one layer's projection of it, split into heads
    c2p_index   (Lq, Lk)    r(i, j);  p2c_index (Lk, Lq): r'(i, j) transposed (key-major)
    terms       (B, H, Lq, Lk) c2p + p2c, already scaled, in the scores' dtype
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "TERMS",
    "RelativeTerms",
    "content_scale",
    "relative_bias",
    "relative_buckets",
    "relative_scores",
]

#: the relative terms a disentangled module may have, by DeBERTa's names
TERMS = ("c2p", "p2c")


def relative_buckets(
    q_len: int,
    k_len: int,
    *,
    buckets: int,
    max_position: int,
    device: torch.device | str | None = None,
) -> Tensor:
    """``(Lq, Lk)`` int64: ``bucket(i - j)``, the relative position of key ``j`` seen from
    query ``i``. With ``buckets > 0`` and ``max_position > 0`` a distance of at least
    ``buckets // 2`` goes to the bucket ``mid + ceil(log(d / mid) / log((max_position - 1) /
    mid) * (mid - 1))`` (sign kept), ``mid = buckets // 2``; else it is the distance itself."""
    i = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
    j = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
    rel = i - j  # (Lq, Lk)
    if buckets <= 0 or max_position <= 0:
        return rel
    mid = buckets // 2
    far = rel.abs()
    near = (rel < mid) & (rel > -mid)
    dist = torch.where(near, torch.full_like(far, mid - 1), far).to(torch.float32)
    ratio = torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32))
    logged = torch.ceil(torch.log(dist / mid) / ratio * (mid - 1)) + mid
    return torch.where(far <= mid, rel.to(torch.float32), logged * rel.sign()).to(torch.long)


@dataclass(frozen=True)
class RelativeTerms:
    """One layer's disentangled position input (the module docstring has the shapes).

    Attributes:
        pos_q: position queries for the p2c term, or None without it.
        pos_k: position keys for the c2p term, or None without it.
        c2p_index: ``r(i, j)``, ``(Lq, Lk)``; sliced to ``[:l, :l]`` for a packed sequence.
        p2c_index: ``r'(i, j)`` key-major, ``(Lk, Lq)``.
        scale: ``1 / sqrt(D * (1 + #terms))``, the factor of all three terms.
    """

    pos_q: Tensor | None
    pos_k: Tensor | None
    c2p_index: Tensor
    p2c_index: Tensor
    scale: float

    def describe(self) -> str:
        """One line for ``explain()``."""
        terms = [n for n, t in zip(TERMS, (self.pos_k, self.pos_q), strict=True) if t is not None]
        return (
            f"disentangled positions: {' + '.join(terms)} relative terms added to the scores "
            f"(scale 1/sqrt({round(1 / self.scale**2)}))"
        )


def relative_scores(q: Tensor, k: Tensor, terms: RelativeTerms) -> tuple[Tensor | None, ...]:
    """The two relative terms for ``q`` ``(B, H, Lq, D)`` and ``k`` ``(B, H, Lk, D)``, each
    ``(B, H, Lq, Lk)`` and scaled, in the dtype of ``q @ k``: ``(c2p, p2c)``, None for a term
    the module does not have."""
    lq, lk = q.size(-2), k.size(-2)
    c2p = p2c = None
    if terms.pos_k is not None:
        # content-to-position: query i's content against the position of key j relative to i
        by_distance = torch.matmul(q, terms.pos_k.transpose(-1, -2))  # (B, H, Lq, 2S)
        index = terms.c2p_index[:lq, :lk].expand(*by_distance.shape[:-1], lk)
        c2p = torch.gather(by_distance, -1, index) * terms.scale  # (B, H, Lq, Lk)
    if terms.pos_q is not None:
        # position-to-content: key j's content against the position of query i relative to j
        by_distance = torch.matmul(k, terms.pos_q.transpose(-1, -2))  # (B, H, Lk, 2S)
        index = terms.p2c_index[:lk, :lq].expand(*by_distance.shape[:-1], lq)
        p2c = torch.gather(by_distance, -1, index).transpose(-1, -2) * terms.scale  # (B,H,Lq,Lk)
    return c2p, p2c


def relative_bias(q: Tensor, k: Tensor, terms: RelativeTerms, bias: Tensor | None) -> Tensor:
    """``c2p + p2c`` (+ ``bias``, an additive mask broadcastable to ``(B, H, Lq, Lk)``) as one
    additive bias for a fused kernel, in ``q``'s dtype."""
    c2p, p2c = relative_scores(q, k, terms)
    total = c2p if p2c is None else p2c if c2p is None else c2p + p2c
    if total is None:
        total = q.new_zeros(q.size(-2), k.size(-2))
    if bias is not None:
        total = total + bias.to(total.dtype)
    return total.to(q.dtype)


def content_scale(head_dim: int, n_terms: int) -> float:
    """DeBERTa's factor of every term: ``1 / sqrt(D * (1 + n_terms))``."""
    return 1.0 / math.sqrt(head_dim * (1 + n_terms))
