"""Attention backends: a registry of plain functions with one signature.

Each backend takes per-head queries, keys and values and a canonical additive bias and returns
``(context, weights | None)``::

    fn(q, k, v, bias, *, dropout_p, need_weights) -> (context, weights)
        q:       (B, H, Lq, D)
        k, v:    (B, H, Lk, D)
        bias:    additive float broadcastable to (B, H, Lq, Lk), >= 2-D, or None (masks.py)
        context: (B, H, Lq, D)
        weights: (B, H, Lq, Lk) or None

A backend with ``layout="packed"`` (``varlen``) works on the real tokens of a padded batch
instead, with no mask (each sequence attends to its own tokens)::

    fn(q, k, v, packed, *, dropout_p) -> context
        q, k, v, context: (T, H, D)     T real tokens, sequence after sequence
        packed:           PackedBatch   (cu_seqlens, max_seqlen; see padding.py)

One with ``packed_bias=True`` (``varlen``) also takes an additive bias per sequence, as MPNet's
relative position bias needs::

    fn(q, k, v, packed, *, dropout_p, bias) -> context
        bias: one (1, H, l_b, l_b) float block per sequence b (None for an empty one), in q's
              dtype, added to that sequence's scaled scores

Backends never see a query row made only of ``-inf``: :mod:`bertattn.attention.masks` resets
such rows and the module zeroes them afterwards, identically for every backend.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .disentangled import RelativeTerms, relative_bias, relative_scores
from .grouped import expand_kv, sdpa
from .masks import causal_bias, score_dtype
from .padding import PackedBatch
from .steps import StepRecord
from .steps import recorder as steps_recorder
from .window import band_bias, local_attention, window_pays

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
    fn: AttentionBackend | Callable[..., Any]
    returns_weights: bool
    layout: str = "padded"  # "padded": (B, H, L, D) + bias; "packed": (T, H, D) + PackedBatch
    #: a packed backend that takes a bias block per sequence (``bias=``; see the module doc)
    packed_bias: bool = False
    #: a packed backend that honours a local window per sequence (``window=``)
    packed_window: bool = False
    #: the :class:`~.inputs.AttentionInputs` fields this backend honours itself, by name
    #: (besides those ``packed_bias`` / ``packed_window`` declare)
    takes: frozenset[str] = frozenset()

    def honours(self, field: str) -> bool:
        """Whether this backend honours the attention input ``field`` itself."""
        if field == "bias" and self.packed_bias:
            return True
        if field == "window" and self.packed_window:
            return True
        return field in self.takes


def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    *,
    dropout_p: float,
    need_weights: bool,
    scale: float | None = None,
    relative: RelativeTerms | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The reference: the article's steps, written out. Softmax in float32 for half inputs.

    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query, :mod:`.grouped`): each is
    then repeated for the query heads it serves, as its own step. ``scale``: the scores'
    factor (None: the article's ``1 / sqrt(d_k)``). ``relative``: DeBERTa's disentangled
    positions (:mod:`.disentangled`), two more terms added to the scaled scores.

    When nothing records the steps and no graph is built, the scaling and the bias are applied
    in place on the scores' one buffer: the same operations on the same values (bit for bit),
    without two more ``(B, H, Lq, Lk)`` tensors to allocate and fill."""
    d = q.size(-1)
    rec = steps_recorder()
    # grouped-query heads: key/value head j serves query heads j*g .. j*g + g-1, so each
    # is repeated g times beside the query heads it serves      # (B, Hkv, Lk, D) -> (B, H, Lk, D)
    groups = q.size(-3) // k.size(-3)
    k, v = expand_kv(k, groups), expand_kv(v, groups)
    # the article: scores = Q K^T / sqrt(d_k)                       # (B, H, Lq, Lk)
    raw = torch.matmul(q, k.transpose(-2, -1)).to(score_dtype(q.dtype))
    in_place = rec is None and _in_place_ok(raw, bias)
    # DeBERTa: + q_i . Pk[r(i, j)] (content-to-position) + k_j . Pq[r'(i, j)]
    # (position-to-content), scaled as the content term         # (B, H, Lq, Lk) each
    c2p, p2c = (None, None) if relative is None else relative_scores(q, k, relative)
    if in_place:
        scaled = raw.div_(math.sqrt(d)) if scale is None else raw.mul_(scale)
        scaled = _plus_terms(scaled, (c2p, p2c), in_place=True)
        scores = scaled if bias is None else scaled.add_(bias)
    else:
        scaled = raw / math.sqrt(d) if scale is None else raw * scale
        scaled = _plus_terms(scaled, (c2p, p2c), in_place=False)
        # the article: masked_fill(mask == 0, -1e9); here an additive -inf bias (every dtype)
        scores = scaled if bias is None else scaled + bias
    # the article: softmax over the keys, then dropout on the probabilities
    weights = torch.softmax(scores, dim=-1).to(q.dtype)  # (B, H, Lq, Lk)
    probs = weights
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    # the article: context = attention @ V                         # (B, H, Lq, D)
    context = torch.matmul(weights, v)
    if rec is not None:  # bertattn.attention.steps: the values above, as they are
        rec.add(StepRecord(q, k, v, raw, scaled, bias, probs, context, c2p=c2p, p2c=p2c))
    return context, (weights if need_weights else None)


def _plus_terms(scaled: Tensor, terms: tuple[Tensor | None, ...], *, in_place: bool) -> Tensor:
    """``scaled`` plus every term that is not None (in place on ``scaled``'s buffer when
    ``in_place``)."""
    for term in terms:
        if term is not None:
            scaled = scaled.add_(term) if in_place else scaled + term
    return scaled


def _in_place_ok(scores: Tensor, bias: Tensor | None) -> bool:
    """The scores may be scaled and biased in place: no autograd graph through them, and a
    bias of their dtype that broadcasts to their shape (an out-of-place sum could promote
    the dtype or grow the shape)."""
    if scores.requires_grad or (bias is not None and bias.requires_grad):
        return False
    return bias is None or (
        bias.dtype == scores.dtype
        and torch.broadcast_shapes(bias.shape, scores.shape) == scores.shape
    )


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    *,
    dropout_p: float,
    need_weights: bool,
    scale: float | None = None,
    relative: RelativeTerms | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Fused ``torch.nn.functional.scaled_dot_product_attention``: O(L) memory, no weights.
    Grouped-query ``k``, ``v`` (fewer heads than ``q``) are shared by the kernel where torch
    can (:func:`.grouped.sdpa`); ``scale``: the scores' factor (None: ``1 / sqrt(D)``);
    ``relative``: DeBERTa's relative terms, computed from q and k and given to the kernel
    with the mask as its additive ``attn_mask`` (``(B, H, Lq, Lk)``: O(L^2) memory)."""
    if need_weights:
        raise ValueError(
            "backend 'sdpa' does not return attention weights; pass need_weights=False, "
            "or use backend='math' (or 'auto', which picks math when weights are needed)."
        )
    if relative is not None:  # DeBERTa's two relative terms, with the mask, as one bias
        bias = relative_bias(q, k, relative, bias)
    work = q.dtype
    if _needs_fp32_backward(q, k, v):
        work = torch.float32
    if bias is not None and bias.dtype != work:
        if work == torch.float16:  # a large finite bias (-1e9) must not turn into -inf
            bias = bias.clamp(min=torch.finfo(torch.float16).min)
        bias = bias.to(work)
    if work != q.dtype:
        q, k, v, out_dtype = q.to(work), k.to(work), v.to(work), q.dtype
    else:
        out_dtype = None  # no cast at all on the common path: .to() costs a few us per call
    if scale is None and k.size(-3) == q.size(-3):  # the article's call, as it always was
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    else:
        context = sdpa(q, k, v, bias, dropout_p=dropout_p, scale=scale)
    return (context if out_dtype is None else context.to(out_dtype)), None


def _needs_fp32_backward(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Half-precision training on CPU: run SDPA in float32.

    torch's fused CPU SDPA backward in bf16/fp16 loses 2.5-4x more precision on the gradients
    through the scores than the math path (whose softmax runs in float32); measured on torch
    2.13 (tests/test_attention_gradients.py). Inference (no grad) keeps the half kernel.
    """
    return (
        q.dtype in (torch.float16, torch.bfloat16)  # first: the cheapest test, usually False
        and q.device.type == "cpu"
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    )


def cuda_varlen(q: Tensor) -> Callable[..., Tensor] | None:
    """torch's flash varlen kernel, where it can run (CUDA, half precision)."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.9
        return None
    return varlen_attn


#: why a biased packed call does not run torch's flash varlen kernel (explain() shows it)
VARLEN_BIAS_WHY = (
    "relative position bias: one fused SDPA call per sequence with its bias block (torch's "
    "flash varlen kernel takes no bias)"
)


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    packed: PackedBatch,
    *,
    dropout_p: float,
    bias: tuple[Tensor | None, ...] | None = None,
    window: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    relative: RelativeTerms | None = None,
) -> Tensor:
    """Attention per sequence on packed tokens: no compute, no memory spent on padding.

    On CUDA in half precision (and without dropout, bias, window or causal mask) torch's flash
    varlen kernel runs all sequences in one launch. Elsewhere each sequence gets one fused SDPA
    call on its own ``(1, H, l, D)`` view; on CPU that beats one padded call as soon as lengths
    differ (docs/performance.md has the numbers). ``bias``: one ``(1, H, l, l)`` block per
    sequence (MPNet's relative position bias), given to that sequence's SDPA call as its
    additive ``attn_mask``; the flash kernel takes none, so a biased call always runs per
    sequence (:data:`VARLEN_BIAS_WHY`). ``window``: local attention inside each sequence
    (``|i - j| <= window``): a sequence longer than its reach runs blocked, the keys out of
    reach skipped (:func:`bertattn.attention.window.local_attention`); a shorter one needs no
    mask at all. A window never runs the flash kernel. ``causal``: token ``i`` of a sequence
    sees its tokens ``j <= i`` only. ``k``, ``v`` ``(T, Hkv, D)`` with fewer heads than ``q``:
    grouped-query heads, shared without a copy where torch can (:mod:`.grouped`).
    ``scale``: the scores' factor (None: ``1 / sqrt(D)``). ``relative``: DeBERTa's relative
    terms (:mod:`.disentangled`; positions restart in every sequence), computed per sequence
    and given to its SDPA call as a bias block.
    """
    if bias is not None and len(bias) != packed.batch:
        raise ValueError(
            f"bias has {len(bias)} blocks for a packed batch of {packed.batch} sequences; give "
            f"one (1, H, l, l) block per sequence."
        )
    plain = dropout_p == 0.0 and bias is None and window is None and not causal
    plain = plain and relative is None
    kernel = cuda_varlen(q) if plain else None
    kwargs = None if kernel is None else _kernel_kwargs(kernel, q, k, scale)
    if kernel is not None and kwargs is not None:
        cu = packed.cu_seqlens
        return kernel(q, k, v, cu, cu, packed.max_seqlen, packed.max_seqlen, **kwargs)
    out = torch.empty_like(q)  # (T, H, D)
    offs = packed.offsets
    for b, (start, end) in enumerate(zip(offs[:-1], offs[1:], strict=True)):
        if end == start:
            continue  # an empty sequence has no query to answer
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1,H,l,D)
        n = end - start
        if window is not None and n > window + 1:  # some pair out of reach
            if window_pays(n, window):
                o = local_attention(qs, ks, vs, window, dropout_p=dropout_p, scale=scale)
            else:
                band = band_bias(n, n, window, dtype=q.dtype, device=q.device)
                o = sdpa(qs, ks, vs, band, dropout_p=dropout_p, scale=scale)  # (1, H, l, D)
            out[start:end] = o[0].transpose(0, 1)
            continue
        block = None if bias is None else bias[b]  # (1, H, l, l) | None
        if block is not None and block.dtype != q.dtype:
            block = block.to(q.dtype)
        if causal:  # token i sees tokens j <= i of its own sequence
            tri = causal_bias(n, n, dtype=q.dtype, device=q.device)  # (l, l)
            block = tri if block is None else block + tri
        if relative is not None:  # DeBERTa's terms of this sequence, (1, H, l, l)
            block = relative_bias(qs, ks, relative, block)
        if scale is None and ks.size(1) == qs.size(1):  # the article's call, as it always was
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=block, dropout_p=dropout_p)
        else:
            o = sdpa(qs, ks, vs, block, dropout_p=dropout_p, scale=scale)  # (1, H, l, D)
        out[start:end] = o[0].transpose(0, 1)
    return out


def _kernel_kwargs(
    kernel: Callable[..., Tensor], q: Tensor, k: Tensor, scale: float | None
) -> dict[str, object] | None:
    """The flash varlen kernel's keyword arguments for shared key/value heads and a scale, or
    None where this torch's kernel cannot take them (the call then runs per sequence)."""
    kwargs: dict[str, object] = {}
    if scale is None and k.size(-2) == q.size(-2):
        return kwargs
    params = inspect.signature(kernel).parameters
    if k.size(-2) != q.size(-2):
        if "enable_gqa" not in params:
            return None
        kwargs["enable_gqa"] = True
    if scale is not None:
        if "scale" not in params:
            return None
        kwargs["scale"] = scale
    return kwargs


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


#: what the built-in backends honour themselves, besides a packed bias and window: shared
#: key/value heads, a scale of the scores, DeBERTa's relative terms
_SHARES_AND_SCALES = frozenset({"kv_heads", "scale", "relative"})

register_backend(
    BackendSpec("math", math_attention, returns_weights=True, takes=_SHARES_AND_SCALES)
)
register_backend(
    BackendSpec("sdpa", sdpa_attention, returns_weights=False, takes=_SHARES_AND_SCALES)
)
register_backend(
    BackendSpec(
        "varlen",
        varlen_attention,
        returns_weights=False,
        layout="packed",
        packed_bias=True,
        packed_window=True,
        takes=_SHARES_AND_SCALES | {"causal"},
    )
)
