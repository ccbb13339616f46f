"""Synthetic ``AttentionMaps`` for the visualizer tests (seeded; no model involved)."""

from __future__ import annotations

import numpy as np

from bertattn.maps import AttentionMaps


def softmax_maps(
    n: int, layers: int, heads: int, *, seed: int = 0, scale: float = 3.0, **kw
) -> AttentionMaps:
    """Random softmax rows (logits ~ N(0, scale)), tokens "tok0".."tok{n-1}"."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        x = rng.normal(0.0, scale, (heads, n, n))  # (H, L, L)
        x = np.exp(x - x.max(axis=-1, keepdims=True))
        out.append((x / x.sum(axis=-1, keepdims=True)).astype(np.float32))
    return AttentionMaps([f"tok{i}" for i in range(n)], out, **kw)
