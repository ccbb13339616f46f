"""Every accepted mask form, turned into one canonical form.

Polarity lives here and nowhere else:

=====================  ===========================  ===========================
argument               shape                        meaning of a value
=====================  ===========================  ===========================
``mask``               broadcastable to             nonzero / True = attend
                       ``(B, H, Lq, Lk)``           (the article's convention)
``key_padding_mask``   ``(B, Lk)``                  nonzero / True = real token
                                                    (Hugging Face polarity)
``attn_bias``          broadcastable to             added to the scores
                       ``(B, H, Lq, Lk)``
=====================  ===========================  ===========================

The canonical form, :class:`PreparedMask`, is one additive float bias (``-inf`` where a key is
masked) and, when some query row has no key left at all, a boolean ``live_rows`` tensor. Such a
"dead" row has its bias reset to zero (so no backend ever sees a row of ``-inf`` and makes NaN,
forward or backward) and its result is multiplied by ``live_rows`` afterwards, which gives zero
weights and a zero context.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from ..arguments import ArgumentTypeError
from ..capture import is_capturing

__all__ = [
    "LastMask",
    "PreparedMask",
    "add_bias",
    "add_causal",
    "causal_bias",
    "prepare_mask",
    "self_attention_mask",
    "score_dtype",
]


@dataclass(frozen=True)
class PreparedMask:
    """A mask in canonical form, ready for any backend.

    Attributes:
        bias: additive float bias, ``-inf`` where masked; ``None`` when nothing is masked or
            biased. Broadcastable to ``(B, H, Lq, Lk)`` and at least 2-D: ``(Lq|1, Lk|1)``,
            with the leading ``B|1, H|1`` present only if a mask argument had them.
        live_rows: bool, the shape of ``bias`` with a last dim of 1, False for a query row with
            no key to attend to; ``None`` when every row has at least one key.
    """

    bias: Tensor | None = None
    live_rows: Tensor | None = None

    @property
    def is_empty(self) -> bool:
        return self.bias is None and self.live_rows is None


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores and softmax are computed in: float32 for half inputs, else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def causal_bias(
    q_len: int, k_len: int, *, dtype: torch.dtype, device: torch.device | str | None = None
) -> Tensor:
    """A causal mask as an additive bias ``(q_len, k_len)``: 0 where query ``i`` may see key
    ``j`` (``j <= i``, the lower triangle), ``-inf`` above the diagonal."""
    future = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(1)  # j > i
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(future, torch.full((), float("-inf"), dtype=dtype, device=device), zero)


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _tracing() -> bool:
    """Under torch.compile / export / ONNX tracing: stay branch-free on tensor values."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _branch_free(device: torch.device) -> bool:
    """Traced, or captured into a graph (capture.py): no branch on a tensor's values, no read
    back to the host, no result cached across calls."""
    return _tracing() or is_capturing(device)


#: ``(shape, target)`` pairs that passed :func:`_check_broadcast` (a shape-only check: failing
#: pairs are never stored, so their errors are raised every time)
_BROADCAST_OK: set[tuple[tuple[int, ...], tuple[int, int, int, int]]] = set()


def _check_broadcast(name: str, t: Tensor, target: tuple[int, int, int, int]) -> None:
    # traced (compile / export / ONNX), shapes may be symbolic and a module-level set would
    # become a guard: no memo there
    case = None if _tracing() else (tuple(t.shape), target)
    if case is not None and case in _BROADCAST_OK:
        return
    b, h, lq, lk = target
    if t.dim() > 4:
        raise ValueError(
            f"{name} has {t.dim()} dimensions {_shape(t)}; expected at most 4, broadcastable to "
            f"(batch, heads, query_len, key_len) = ({b}, {h}, {lq}, {lk})."
        )
    try:
        out = torch.broadcast_shapes(tuple(t.shape), target)
    except RuntimeError:
        out = None
    if out != target:
        raise ValueError(
            f"{name} of shape {_shape(t)} cannot broadcast to (batch, heads, query_len, key_len) "
            f"= ({b}, {h}, {lq}, {lk}). Give it a shape such as ({lq}, {lk}), ({b}, 1, {lq}, {lk}) "
            f"or ({b}, 1, 1, {lk}); for a per-token padding mask of shape ({b}, {lk}) use "
            f"key_padding_mask=."
        )
    if case is not None:
        if len(_BROADCAST_OK) > 1024:
            _BROADCAST_OK.clear()
        _BROADCAST_OK.add(case)


def _check_mask_dtype(name: str, t: Tensor) -> None:
    if t.is_complex():
        raise ValueError(
            f"{name} has dtype {t.dtype}; expected bool, an integer or a real float dtype "
            f"(nonzero / True = keep). Convert it with .bool()."
        )


def _check_mask_tensor(name: str, t: object) -> None:
    """``t`` (the argument ``name``, not None) is a tensor of a mask's dtype, or raise."""
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}.")
    _check_mask_dtype(name, t)


def _keep_from_mask(mask: Tensor, target: tuple[int, int, int, int]) -> Tensor:
    """The article's ``mask`` (nonzero = attend) as a bool tensor, shape-checked."""
    _check_mask_tensor("mask", mask)
    b, _, lq, lk = target
    if mask.dim() == 2 and b > 1 and tuple(mask.shape) == (b, lk) and b != lq:
        raise ValueError(
            f"mask of shape {_shape(mask)} looks like a per-token padding mask (batch, key_len); "
            f"a 2-D mask is read as (query_len, key_len) = ({lq}, {lk}), so it would be misread. "
            f"Pass it as key_padding_mask= (1 = real token), or as mask[:, None, None, :]."
        )
    _check_broadcast("mask", mask, target)
    return mask != 0


def _keep_from_padding(key_padding_mask: Tensor, target: tuple[int, int, int, int]) -> Tensor:
    """``key_padding_mask`` (B, Lk), nonzero = real token, as bool ``(B, 1, 1, Lk)``."""
    _check_mask_tensor("key_padding_mask", key_padding_mask)
    b, _, _, lk = target
    if tuple(key_padding_mask.shape) != (b, lk):
        raise ValueError(
            f"key_padding_mask has shape {_shape(key_padding_mask)}; expected (batch, key_len) = "
            f"({b}, {lk}) with 1 / True for a real token and 0 / False for padding."
        )
    return (key_padding_mask != 0)[:, None, None, :]  # (B, 1, 1, Lk)


def self_attention_mask(
    key_padding_mask: Tensor | None, attn_bias: Tensor | None, *, heads: int, like: Tensor
) -> PreparedMask:
    """:func:`prepare_mask` for self-attention over ``like`` ``(B, L, ...)``: query and key
    length ``L``, ``heads`` heads, the dtype and device of ``like``; ``key_padding_mask``
    ``(B, L)`` and ``attn_bias`` as :func:`prepare_mask` takes them."""
    return prepare_mask(
        None,
        key_padding_mask,
        attn_bias,
        batch=like.shape[0],
        heads=heads,
        query_len=like.shape[1],
        key_len=like.shape[1],
        dtype=like.dtype,
        device=like.device,
    )


def prepare_mask(
    mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    attn_bias: Tensor | None = None,
    *,
    batch: int,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> PreparedMask:
    """Validate every mask argument and fold them into one :class:`PreparedMask`.

    ``dtype`` is the dtype of the attention inputs; the bias is made in :func:`score_dtype`
    of it (float32 for half inputs) so the math backend can add it at full precision.

    Raises:
        ValueError: a mask that cannot broadcast, a ``(B, L)`` padding mask passed as ``mask``,
            a complex mask, a non-float ``attn_bias``, ``key_padding_mask`` of the wrong shape.
    """
    if mask is None and attn_bias is None:
        if key_padding_mask is None:
            return _EMPTY
        if isinstance(key_padding_mask, Tensor) and not _branch_free(device):
            fast = _padding_only(key_padding_mask, batch, key_len, dtype, device)
            if fast is not None:
                return fast
    target = (batch, heads, query_len, key_len)
    keep = None if mask is None else _keep_from_mask(mask, target).to(device)
    if key_padding_mask is not None:
        pad_keep = _keep_from_padding(key_padding_mask, target).to(device)
        keep = pad_keep if keep is None else keep & pad_keep

    bias_dtype = score_dtype(dtype)
    bias: Tensor | None = None
    if attn_bias is not None:
        if not isinstance(attn_bias, Tensor) or not attn_bias.is_floating_point():
            got = attn_bias.dtype if isinstance(attn_bias, Tensor) else type(attn_bias).__name__
            raise ArgumentTypeError(
                f"attn_bias must be a floating-point tensor added to the scores, got {got}. "
                f"For a keep/drop mask use mask= (True = attend) instead."
            )
        _check_broadcast("attn_bias", attn_bias, target)
        bias = attn_bias.to(device=device, dtype=bias_dtype)

    if keep is None and bias is None:
        return PreparedMask()
    if keep is not None:  # bias is None here only if attn_bias was not given
        zeros = torch.zeros((), dtype=bias_dtype, device=device)
        neg_inf = torch.full((), float("-inf"), dtype=bias_dtype, device=device)
        fill = torch.where(keep, zeros, neg_inf)
        bias = fill if bias is None else bias + fill
    if bias.dim() < 2:  # 0-D / 1-D: a (1, Lk|1) view; fused SDPA reads the query dim, size(-2)
        bias = bias.reshape((1,) * (2 - bias.dim()) + tuple(bias.shape))

    # a count, not .any(): the same in eager; exported, ReduceSum keeps ONNX Runtime's symbolic
    # shape inference (and so its fusions) working, where any()'s ReduceMax stops it
    live = (bias != float("-inf")).sum(dim=-1, keepdim=True) > 0  # (B|1, H|1, Lq|1, 1)
    if not _branch_free(device) and bool(live.all()):  # eager: no zeroing when no row is dead
        return PreparedMask(bias=bias)
    return PreparedMask(bias=bias.masked_fill(~live, 0.0), live_rows=live)


_EMPTY = PreparedMask()


def _padding_only(
    key_padding_mask: Tensor,
    batch: int,
    key_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> PreparedMask | None:
    """The common case, a valid ``key_padding_mask`` alone with a key in every row, in three
    tensor ops (none kept when nothing is padding: an all-ones mask is no mask, as in
    transformers' sdpa path); None for anything else (the general path then checks, raises or
    zeroes)."""
    if key_padding_mask.is_complex() or key_padding_mask.shape != (batch, key_len):
        return None
    # the same mask tensor again, unchanged (every layer of an encoder, a loop over calls):
    # the same result. Inference tensors have no version counter: not cached.
    cacheable = not key_padding_mask.is_inference()
    if cacheable:
        key = (batch, key_len, dtype, device, torch.is_inference_mode_enabled())
        last = _LAST_PADDING.get(key_padding_mask, key)
        if last is not None:
            return last
    keep = key_padding_mask if key_padding_mask.dtype == torch.bool else key_padding_mask != 0
    if keep.device != device:
        keep = keep.to(device)
    if bool(keep.all()):  # no padding at all: no mask (the kernels then run unmasked)
        prepared = _EMPTY
    else:
        live = keep.any() if batch == 1 else keep.any(dim=-1).all()
        if not bool(live):  # a row of padding only: dead rows, general path
            return None
        zero, neg_inf = _fill_values(score_dtype(dtype), device)
        keep = keep.reshape(batch, 1, 1, key_len)  # a view when it can be (indexing is slower)
        prepared = PreparedMask(bias=torch.where(keep, zero, neg_inf))  # (B, 1, 1, Lk)
    if cacheable:
        _LAST_PADDING.put(key_padding_mask, key, prepared)
    return prepared


class LastMask:
    """The mask prepared from the last tensor seen, reused while that very tensor is alive and
    unmodified (its in-place version the same) and the rest of the case (``key``) is the same:
    an encoder passes one mask tensor to each of its layers. The entry is dropped when the
    tensor is freed. Not for inference tensors (they have no version counter)."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry: tuple[weakref.ref, int, tuple[object, ...], PreparedMask] | None = None

    def get(self, source: Tensor, key: tuple[object, ...]) -> PreparedMask | None:
        """The mask prepared from ``source`` for ``key``, or None when not this case."""
        entry = self._entry
        if (
            entry is not None
            and entry[0]() is source
            and entry[1] == source._version
            and entry[2] == key
        ):
            return entry[3]
        return None

    def put(self, source: Tensor, key: tuple[object, ...], prepared: PreparedMask) -> None:
        """Keep ``prepared`` as the mask of ``source`` for ``key`` (replacing the last one)."""
        self._entry = (weakref.ref(source, self._forget), source._version, key, prepared)

    def _forget(self, ref: weakref.ref) -> None:
        entry = self._entry
        if entry is not None and entry[0] is ref:
            self._entry = None


#: the latest padding-only result
_LAST_PADDING = LastMask()


#: ``(dtype, device) -> (0, -inf)`` as 0-d tensors, made once (torch.where takes tensors faster
#: than Python scalars, and the result gets their dtype)
_FILL: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}


def _fill_values(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    key = (dtype, device)
    pair = _FILL.get(key)
    if pair is None:
        with torch.inference_mode(False):  # plain tensors, usable in and out of inference mode
            pair = (
                torch.zeros((), dtype=dtype, device=device),
                torch.full((), float("-inf"), dtype=dtype, device=device),
            )
        _FILL[key] = pair
    return pair


def add_bias(
    prepared: PreparedMask,
    extra: Tensor,
    *,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
) -> PreparedMask:
    """``prepared`` with ``extra`` (an additive ``(Lq, Lk)`` bias, ``-inf`` where a key is out
    of reach: a band, a causal triangle) added: the keys it masked stay masked, and a query row
    that had no key keeps none. ``dtype``: the attention inputs' dtype."""
    bias = extra if prepared.bias is None else prepared.bias + extra
    if prepared.live_rows is not None:  # rows with no key at all: none after the extra either
        bias = bias.masked_fill(~prepared.live_rows, float("-inf"))
    return prepare_mask(
        attn_bias=bias,
        batch=bias.shape[0] if bias.dim() == 4 else 1,
        heads=heads,
        query_len=query_len,
        key_len=key_len,
        dtype=dtype,
        device=bias.device,
    )


def add_causal(
    prepared: PreparedMask,
    *,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> PreparedMask:
    """``prepared`` with a causal mask added: query ``i`` sees key ``j`` only when ``j <= i``
    (the lower triangle of :func:`causal_bias`), besides what ``prepared`` masks."""
    if prepared.bias is not None:
        device = prepared.bias.device
    tri = causal_bias(query_len, key_len, dtype=score_dtype(dtype), device=device)  # (Lq, Lk)
    return add_bias(prepared, tri, heads=heads, query_len=query_len, key_len=key_len, dtype=dtype)
