"""Grouped-query heads: fewer key/value heads than query heads, each shared by a group.

The article gives every query head its own key and value head. Grouped-query attention
(Qwen3, EuroBERT, Gemma 3; multi-query when there is one key/value head) projects ``Hkv`` key
and value heads and lets each serve ``g = H / Hkv`` consecutive query heads: query head ``h``
reads key/value head ``h // g``. The scores are the article's; only the K/V projections shrink.

Two ways to run it::

    expanded:  k, v (B, Hkv, L, D) --repeat each head g times--> (B, H, L, D), then as before
               (what ``math`` shows as its own step; a copy of K and V per query head)
    shared:    scaled_dot_product_attention(q, k, v, enable_gqa=True): the kernel reads head
               h // g itself, no copy (torch >= 2.5)

The same holds for packed ``(T, H, D)`` / ``(T, Hkv, D)`` tensors (the head axis is -3 for
padded and -2 for packed tensors).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SDPA_SHARES_HEADS", "expand_kv", "sdpa", "sharing_note"]


def _sdpa_has_gqa() -> bool:
    """Whether this torch's SDPA takes ``enable_gqa`` (torch 2.5 and later)."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


#: this torch's fused SDPA shares key/value heads itself (``enable_gqa=True``)
SDPA_SHARES_HEADS = _sdpa_has_gqa()


def expand_kv(t: Tensor, groups: int, head_axis: int = -3) -> Tensor:
    """Each key/value head repeated ``groups`` times along ``head_axis``, in place of the
    group of query heads it serves: ``(..., Hkv, L, D)`` -> ``(..., Hkv * groups, L, D)``."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=head_axis)


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    *,
    dropout_p: float,
    scale: float | None = None,
) -> Tensor:
    """``scaled_dot_product_attention`` on ``(B, H, Lq, D)`` queries and ``(B, Hkv, Lk, D)``
    keys and values, ``H`` a multiple of ``Hkv``: the heads shared by the kernel where torch
    can (no copy), else expanded. ``scale``: the scores' factor (None: ``1 / sqrt(D)``)."""
    groups = q.shape[-3] // k.shape[-3]
    kwargs: dict[str, object] = {} if scale is None else {"scale": scale}
    if groups != 1:
        if SDPA_SHARES_HEADS:
            kwargs["enable_gqa"] = True
        else:
            k, v = expand_kv(k, groups), expand_kv(v, groups)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          **kwargs)  # fmt: skip


def sharing_note(backend: str, heads: int, kv_heads: int) -> str:
    """One line for ``explain()``: how ``backend`` served ``heads`` query heads from
    ``kv_heads`` key/value heads."""
    g = heads // kv_heads
    what = f"grouped-query heads: {kv_heads} key/value heads, each shared by {g} query heads"
    if backend == "math":
        return f"{what}; K and V repeated per query head (math's sharing step)"
    if backend in ("sdpa", "varlen") and SDPA_SHARES_HEADS:
        return f"{what}; SDPA enable_gqa=True (no K/V copy per query head)"
    if backend in ("sdpa", "varlen"):
        return f"{what}; K and V expanded per query head (this torch's SDPA has no enable_gqa)"
    return f"{what}; shared by the backend {backend!r} itself"
