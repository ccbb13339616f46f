"""Local (sliding-window) attention: a token sees only the keys within ``window`` positions.

A window ``w`` lets query ``i`` attend to key ``j`` when ``|i - j| <= w`` (ModernBERT's local
layers: ``w = local_attention // 2``, 64 for its 128-token window). Two ways to honour it:

* **masked**: the band as an additive bias, ``-inf`` outside it (:func:`band_bias`). The scores
  outside the band are still computed, then thrown away: O(L^2) work, exact.
* **exploited**: :func:`local_attention` cuts the queries into blocks and gives each block only
  the keys its band can reach, ``block + 2w`` of them, so the work grows with ``L * w`` instead
  of ``L^2``; still exact (the band inside each block is a bias as above).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from .grouped import sdpa
from .masks import PreparedMask, add_bias, score_dtype

__all__ = [
    "LOCAL_BLOCK",
    "WindowedMask",
    "band_bias",
    "banded",
    "check_window",
    "local_attention",
    "tile_bias",
    "window_pays",
]

#: queries per block of :func:`local_attention`: ``block + 2 window`` keys each, so a smaller block
#: wastes fewer scores outside the band (ModernBERT's window 64: 50% of them thrown away at 128,
#: 33% at 64) for more kernel calls. One local layer's attention at 2,048 tokens, 12 heads of 64,
#: window 64, 1 thread, AMD EPYC (Zen 3), median CPU ms of 7, blocks of 32 / 64 / 96 / 128 / 256:
#: 30 / 31 / 35 / 37 / 50; the 14 local layers of one 2,048-token ModernBERT-base call, median
#: CPU s of 4, blocks of 32 / 64 / 128: 0.46 / 0.50 / 0.56 (each halving gains less, and doubles
#: the calls)
LOCAL_BLOCK = 64


def check_window(window: object, name: str = "window") -> int | None:
    """``window`` as an int >= 0, or None (no window); anything else: ValueError naming it."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(
            f"{name} must be None (every key) or an int >= 0 (query i sees key j when "
            f"|i - j| <= {name}), got {window!r}."
        )
    return window


def band_bias(
    q_len: int,
    k_len: int,
    window: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    q_start: int = 0,
    k_start: int = 0,
) -> Tensor:
    """The window as an additive bias ``(q_len, k_len)``: 0 where ``|i - j| <= window``, ``-inf``
    elsewhere; query ``a`` is position ``q_start + a``, key ``b`` position ``k_start + b``."""
    i = torch.arange(q_start, q_start + q_len, device=device)[:, None]  # (Lq, 1)
    j = torch.arange(k_start, k_start + k_len, device=device)[None, :]  # (1, Lk)
    inside = (i - j).abs() <= window  # (Lq, Lk)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(inside, zero, torch.full((), float("-inf"), dtype=dtype, device=device))


@lru_cache(maxsize=64)
def _kept_tile_bias(
    q_len: int, k_len: int, window: int, offset: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    with torch.inference_mode(False), torch.no_grad():  # a plain tensor: training may use it too
        return band_bias(q_len, k_len, window, dtype=dtype, device=device, q_start=offset)


def tile_bias(
    q_len: int, k_len: int, window: int, offset: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """The band of a tile of ``q_len`` queries and ``k_len`` keys whose first query sits
    ``offset`` positions after its first key, ``(q_len, k_len)`` as :func:`band_bias`; made
    once per geometry and kept (every inner tile of every local layer has the same one: 2,048
    tokens in blocks of 64 are 32 tiles of 3 geometries, made once for all layers and calls).
    Read only: add to it out of place."""
    if torch.compiler.is_compiling():
        return band_bias(q_len, k_len, window, dtype=dtype, device=device, q_start=offset)
    return _kept_tile_bias(q_len, k_len, window, offset, dtype, torch.device(device))


def window_pays(length: int, window: int, block: int = LOCAL_BLOCK) -> bool:
    """Whether blocking a sequence of ``length`` tokens skips any work: some block of queries
    has keys outside its reach (``block + 2 * window`` keys fewer than ``length``)."""
    return length > block + 2 * window


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    *,
    dropout_p: float = 0.0,
    block: int = LOCAL_BLOCK,
    key_bias: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Exact banded attention, with the work outside the band skipped.

    ``q, k, v``: ``(B, H, L, D)`` (rotated already, if the model rotates); returns the context
    ``(B, H, L, D)``. Queries ``[s, e)`` attend to keys ``[s - window, e + window)`` (clipped
    to the sequence) with the band inside that tile as a bias: ``L * (block + 2 window)``
    scores instead of ``L^2``. ``key_bias``: an additive bias per key, ``(B|1, 1, 1, L)``
    (a padded batch's padding, ``-inf`` at padding), added in every tile; a query whose tile
    holds no key it may see (a padding position far past its row's end) gets a zero context.
    ``k``, ``v`` may have fewer heads than ``q`` (grouped-query, shared by the kernel:
    :func:`.grouped.sdpa`); ``scale``: the scores' factor (None: ``1 / sqrt(D)``).
    """
    length = q.shape[-2]
    out = torch.empty_like(q)
    for s in range(0, length, block):
        e = min(s + block, length)
        ks, ke = max(0, s - window), min(length, e + window)
        bias = tile_bias(e - s, ke - ks, window, s - ks, q.dtype, q.device)  # (e - s, ke - ks)
        if key_bias is not None:
            bias = bias + key_bias[..., ks:ke].to(q.dtype)  # (B|1, 1, e - s, ke - ks)
        tile = sdpa(
            q[..., s:e, :],
            k[..., ks:ke, :],
            v[..., ks:ke, :],
            bias,
            dropout_p=dropout_p,
            scale=scale,
        )  # (B, H, e - s, D)
        if key_bias is not None:
            dead = torch.isinf(bias).all(dim=-1, keepdim=True)  # rows with no key at all
            tile = tile.masked_fill(dead, 0.0)
        out[..., s:e, :] = tile
    return out


class WindowedMask:
    """A padded batch's mask with a local window, for :meth:`MultiHeadAttention.attend`: the
    plain mask (``base``) for a kernel that skips the keys out of reach
    (:func:`local_attention`), or the mask with the band added (:meth:`banded`, made on first
    use and kept: every layer of the same window shares it) for one that masks."""

    def __init__(
        self, base: PreparedMask, window: int, length: int, *, heads: int, dtype: torch.dtype
    ) -> None:
        self.base, self.window, self.length = base, window, length
        self.heads, self.dtype = heads, dtype
        self._banded: PreparedMask | None = None

    def banded(self) -> PreparedMask:
        if self._banded is None:
            self._banded = banded(
                self.base, self.window, self.length, heads=self.heads, dtype=self.dtype
            )
        return self._banded

    def key_bias(self) -> Tensor | None | bool:
        """The base mask as a bias per key ``(B|1, 1, 1, L)`` (None: nothing masked), or False
        when it is not one (a mask per query too: only :meth:`banded` can carry it)."""
        bias = self.base.bias
        if bias is None:
            return None if self.base.live_rows is None else False
        if bias.dim() == 4 and bias.shape[1] == 1 and bias.shape[2] == 1:
            return bias
        if bias.dim() == 2 and bias.shape[0] == 1:
            return bias.view(1, 1, 1, -1)
        return False


def banded(
    prepared: PreparedMask, window: int, length: int, *, heads: int, dtype: torch.dtype
) -> PreparedMask:
    """A padded batch's prepared mask with the window added: the keys it masks stay masked, and
    those beyond ``window`` of each query too (a padded local layer, masked). A query row that
    had no key keeps none. ``length``: the padded length L; ``dtype``: the attention inputs'."""
    device = prepared.bias.device if prepared.bias is not None else None
    band = band_bias(length, length, window, dtype=score_dtype(dtype), device=device)  # (L, L)
    return add_bias(prepared, band, heads=heads, query_len=length, key_len=length, dtype=dtype)
