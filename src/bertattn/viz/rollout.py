"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

How much each input token flows into each position after all layers, following the residual
connections. For every layer ``l`` (in the order of ``maps.layers``):

1. reduce the heads:            ``W_l = mean_h A_l[h]``                      (L, L)
2. account for the residual:    ``Â_l = rownorm(W_l + I)`` (= ``0.5 W_l + 0.5 I`` for rows
   that sum to 1; a row with no attention, e.g. padding, keeps only its identity)
3. multiply through the layers: ``R_1 = Â_1``, ``R_l = Â_l @ R_{l-1}``

Row ``i`` of the result is query position ``i`` after the last layer, column ``j`` the input token;
every row sums to 1.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..maps import AttentionMaps

__all__ = ["attention_rollout", "HEAD_REDUCTIONS"]

HEAD_REDUCTIONS = ("mean", "max", "min")


def attention_rollout(
    maps: AttentionMaps, *, head_reduce: str = "mean", residual: bool = True
) -> np.ndarray:
    """Roll the attention out through all layers of ``maps``; returns float32 ``(L, L)``.

    Args:
        maps: the attention of one text. The rollout runs over the layers it holds, in order;
            if they are not all the model's layers from 0 a ``UserWarning`` says so.
        head_reduce: how to merge the heads of a layer: ``"mean"`` (the paper), ``"max"``,
            ``"min"``.
        residual: add the identity (the residual stream) before renormalising, as in the paper.
            ``False`` gives the plain product of the head-reduced matrices (rows renormalised).
    """
    if head_reduce not in HEAD_REDUCTIONS:
        raise ValueError(f"head_reduce={head_reduce!r} is not one of {', '.join(HEAD_REDUCTIONS)}")
    if maps.layer_ids != list(range(maps.num_layers)):
        warnings.warn(
            f"rollout over layers {maps.layer_ids} only, not the whole model from layer 0",
            UserWarning,
            stacklevel=2,
        )
    n = len(maps.tokens)
    eye = np.eye(n, dtype=np.float64)
    result = eye
    for a in maps.layers:  # (H, L, L)
        w = getattr(np, head_reduce)(a.astype(np.float64), axis=0)  # (L, L)
        if residual:
            w = w + eye
        sums = w.sum(axis=-1, keepdims=True)  # (L, 1)
        w = np.divide(w, sums, out=eye.copy(), where=sums > 0)  # an all-zero row -> identity
        result = w @ result
    return result.astype(np.float32)
