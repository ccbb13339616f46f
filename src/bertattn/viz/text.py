"""A plain-text summary of one head: what ``bertattn attend`` prints without an output option."""

from __future__ import annotations

import numpy as np

from ..maps import AttentionMaps
from ._common import check_layer_head
from .words import display_width, ljust, subword_note

__all__ = ["summary"]


def summary(maps: AttentionMaps, *, layer: int, head: int, top: int = 3) -> str:
    """The tokens, then for ``layer``/``head`` each query token's ``top`` most attended keys.

    ``layer`` is the model's layer id (one of ``maps.layer_ids``); a line under the tokens
    says what their subword mark (``##``, ``▁``, ``Ġ``) means, when they carry one. Example line::

        3 cat         -> the 0.412 | cat 0.201 | [CLS] 0.100
    """
    idx = check_layer_head(maps, layer, head)
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    w = maps.layers[idx][head]  # (L, L)
    n = len(maps.tokens)
    k = min(top, n)
    order = np.argsort(-w, axis=-1, kind="stable")[:, :k]  # (L, k)
    name = f"{maps.model_name}, " if maps.model_name else ""
    lines = [
        f"{name}layer {layer}, head {head}: {n} tokens, top {k} keys per query",
        "tokens: " + " ".join(f"{i}:{t}" for i, t in enumerate(maps.tokens)),
    ]
    note = subword_note(maps.tokens)
    lines += [note] if note else []
    width = min(max(display_width(t) for t in maps.tokens), 16)  # CJK characters take 2
    num = len(str(n - 1))
    for q in range(n):
        keys = " | ".join(f"{maps.tokens[j]} {w[q, j]:.3f}" for j in order[q])
        lines.append(f"{q:>{num}} {ljust(maps.tokens[q], width)} -> {keys}")
    return "\n".join(lines) + "\n"
