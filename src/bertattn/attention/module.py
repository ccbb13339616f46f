"""``MultiHeadAttention``: the article's module with its API and weights, made correct and fast.

Data flow of one call (B batch, Lq / Lk query / key length, E embed_dim, H heads, D = E // H)::

    x (B, Lq, E) --fused QKV GEMM--> (B, Lq, 3E) --split heads--> q, k, v (B, H, L, D)
        --backend(q, k, v, bias)--> context (B, H, Lq, D) --merge heads--> (B, Lq, E)
        --out_linear--> output (B, Lq, E)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arguments import ArgumentTypeError, check_bool, check_str, describe, is_int
from . import fastcall as _fast
from . import policy as _policy
from . import prepack as _prepack
from . import steps as _steps
from .backends import BackendSpec, get_backend
from .disentangled import TERMS, RelativeTerms, content_scale, relative_buckets
from .dispatch import Dispatch, choose_backend, record, recording
from .grouped import sharing_note
from .inputs import NO_INPUTS, AttentionInputs, check_inputs
from .masks import PreparedMask, add_causal, prepare_mask
from .padding import PackedBatch, pack_padding_mask, pad, unpad
from .rotary import (
    Rotation,
    apply_rotation,
    inverse_frequencies,
    rotation_for_packed,
    rotation_for_positions,
)
from .steps import StepRecorder
from .steps import recorder as steps_recorder
from .window import WindowedMask, check_window, local_attention, window_pays

__all__ = ["MultiHeadAttention"]


def _varlen_bias_note(q: Tensor, dropout_p: float) -> str:
    """How ``varlen`` carries a bias for ``q`` ``(T, H, D)``: where the flash varlen kernel
    would have run without one, the fallback and why (:data:`~.backends.VARLEN_BIAS_WHY`)."""
    from .backends import VARLEN_BIAS_WHY, cuda_varlen

    if dropout_p == 0.0 and cuda_varlen(q) is not None:
        return VARLEN_BIAS_WHY
    return "relative position bias added per sequence (one fused SDPA call each, bias as attn_mask)"


def _window_note(packed: PackedBatch, window: int) -> str:
    """What ``varlen`` did with a window, for ``explain()``: exploited (blocks of queries, the
    keys out of reach skipped) on the sequences long enough for it to pay, else nothing to do."""
    lengths = [e - s for s, e in zip(packed.offsets[:-1], packed.offsets[1:], strict=True)]
    long = sum(1 for n in lengths if window_pays(n, window))
    if not long:
        return f"window {window}: every sequence within reach of it (no key to skip)"
    return (
        f"window {window}: exploited on {long} of {len(lengths)} sequences (query blocks see "
        f"only the keys in reach; the rest skipped)"
    )


def _window_plan(
    prepared: PreparedMask | WindowedMask,
    name: str,
    need_weights: bool,
    key_value: Tensor | None,
    x: Tensor,
) -> tuple[PreparedMask, int | None, bool]:
    """A padded call's mask and window: ``(mask, window, exploit)``. A local window (a
    :class:`WindowedMask`) is exploited by ``sdpa`` (the keys out of reach skipped) where it
    pays and the mask is a bias per key; else masked (the band added to the mask)."""
    if not isinstance(prepared, WindowedMask):
        return prepared, None, False
    key_bias = prepared.key_bias()
    exploit = (
        name == "sdpa"
        and not need_weights
        and key_bias is not False
        and key_value is None
        and window_pays(x.shape[1], prepared.window)
    )
    return (prepared.base if exploit else prepared.banded()), prepared.window, exploit


def _positioned(
    q: Tensor, k: Tensor, inputs: AttentionInputs, rec: StepRecorder | None
) -> tuple[Tensor, Tensor]:
    """The seam's work on q and k, whatever their layout (``(B, H, L, D)`` or ``(T, H, D)``):
    rotary positions turn them (v as it is). ``rec``: the steps recorder, told q and k as
    they were and the position schemes of the call."""
    rotation = inputs.rotation
    if rec is not None and (rotation is not None or inputs.window is not None):
        theta = None if rotation is None else rotation.theta
        rec.note_positions(q, k, theta, inputs.window)  # q, k before the rotation
    if rotation is not None:
        q, k = apply_rotation(q, k, rotation)
    return q, k


#: how a padded call honoured its window, for ``explain()``: exploited / masked
_WINDOW_HOW = {
    True: "exploited (query blocks see only the keys in reach; the rest skipped)",
    False: "masked (a band bias, no work skipped)",
}


def _describe(reason: str, inputs: AttentionInputs, backend: str, heads: int, qk_norm: bool) -> str:
    """``reason`` with what the call's inputs changed in the formula, for ``explain()``."""
    notes = [reason]
    if qk_norm:
        notes.append("q/k norm: RMSNorm over the head size on q and k before the product")
    if inputs.rotation is not None:
        notes.append(inputs.rotation.describe())
    if inputs.kv_heads is not None:
        notes.append(sharing_note(backend, heads, inputs.kv_heads))
    if inputs.causal:
        notes.append("causal: query i sees keys j <= i only (a lower-triangular mask)")
    if inputs.relative is not None:
        notes.append(inputs.relative.describe())
    elif inputs.scale is not None:
        notes.append(f"scores scaled by {inputs.scale:g} (not 1/sqrt(head_dim))")
    return "; ".join(notes)


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


_QKV_NAMES = ("q_linear", "k_linear", "v_linear")

_MISSING = object()

#: input cases that passed every shape / dtype / device check of forward, and their ``auto``
#: decision: ``signature -> (backend, reason)``, valid for one policy table object
_CASES: dict[tuple[object, ...], tuple[str, str]] = {}
_NO_MASK = PreparedMask()
_CASES_TABLE: list[object] = [None]


def _cat(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``; on the ``meta`` device (a checkpoint's model is built there before
    its tensors are assigned) an empty tensor of the same shape: ``cat``'s meta kernel is Python
    whose first call imports ``torch._dynamo``, about 1.3 s of a process's start."""
    if parts[0].device.type == "meta":
        shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        return torch.empty(shape, dtype=parts[0].dtype, device="meta")
    return torch.cat(parts)


def _check_widths(
    embed_dim: object, num_heads: object, dropout: object, backend: object
) -> tuple[int, int]:
    """The constructor's ``embed_dim``, ``num_heads`` (as ints), ``dropout`` and ``backend``
    checked: an error names the argument, what came and what is expected."""
    if not is_int(embed_dim) or not is_int(num_heads):
        raise ArgumentTypeError(
            f"embed_dim and num_heads must be ints, got {embed_dim!r} and {num_heads!r}."
        )
    if isinstance(dropout, (bool, np.bool_)) or not isinstance(
        dropout, (int, float, np.integer, np.floating)
    ):
        raise ArgumentTypeError(f"dropout must be a float in [0, 1), got {describe(dropout)}.")
    check_str(backend, "backend")
    if int(embed_dim) <= 0 or int(num_heads) <= 0:  # type: ignore[call-overload]
        raise ValueError(
            f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads}); "
            f"for example embed_dim=64 * num_heads."
        )
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
    if backend != "auto":
        get_backend(backend)  # type: ignore[arg-type]  # raises with the list of valid names
    return int(embed_dim), int(num_heads)  # type: ignore[call-overload]


def _check_heads(
    embed_dim: int, num_heads: int, head_dim: object, num_kv_heads: object
) -> tuple[int, int]:
    """``(head_dim, num_kv_heads)`` with their defaults (``embed_dim // num_heads`` and
    ``num_heads``), checked: a head size that is an int >= 1, query heads a multiple of the
    key/value heads."""
    if head_dim is None:
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads "
                f"({num_heads}); for example embed_dim=64 * num_heads, or give head_dim=."
            )
        head_dim = embed_dim // num_heads
    elif not is_int(head_dim) or int(head_dim) < 1:  # type: ignore[call-overload]
        raise ValueError(f"head_dim must be an int >= 1 (the size of one head), got {head_dim!r}.")
    if num_kv_heads is None:
        num_kv_heads = num_heads
    elif (
        not is_int(num_kv_heads)
        or int(num_kv_heads) < 1  # type: ignore[call-overload]
        or num_heads % int(num_kv_heads) != 0  # type: ignore[call-overload]
    ):
        raise ValueError(
            f"num_kv_heads must be an int >= 1 that divides num_heads ({num_heads}), got "
            f"{num_kv_heads!r}; each key/value head serves num_heads / num_kv_heads query heads."
        )
    return int(head_dim), int(num_kv_heads)  # type: ignore[call-overload]


def _check_scale(scale: object) -> float | None:
    """``scale`` as a positive float, or None (the article's ``1 / sqrt(head_dim)``)."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(
            f"scale must be None (1/sqrt(head_dim)) or a positive number, got {scale!r}; for a "
            f"config's query_pre_attn_scalar s, pass scale=s ** -0.5."
        )
    return float(scale)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the article's API: ``forward(x, mask) -> (output, attention)``.

    Args:
        embed_dim: model width E; must be divisible by ``num_heads`` unless ``head_dim`` is
            given.
        num_heads: number of (query) heads H.
        dropout: dropout probability on the attention probabilities (training only).
        bias: whether the four projections have a bias.
        backend: ``"auto"`` or a registered backend name (``"math"``, ``"sdpa"``, ...).
        rotary_theta: rotate queries and keys by their positions before the scores (rotary
            position embeddings with this base, e.g. 10000.0; :mod:`bertattn.attention.rotary`);
            None (the article): no rotation.
        window: local attention, query ``i`` sees key ``j`` only when ``|i - j| <= window``
            (:mod:`bertattn.attention.window`); None (the article): every key.
        num_kv_heads: key/value heads Hkv, each shared by ``H / Hkv`` query heads
            (grouped-query; 1: multi-query; :mod:`bertattn.attention.grouped`); None (the
            article): ``num_heads``.
        head_dim: the size D of one head; None (the article): ``embed_dim // num_heads``.
        scale: the factor of the scores; None (the article): ``1 / sqrt(head_dim)``. A config's
            ``query_pre_attn_scalar`` s gives ``scale = s ** -0.5``.
        causal: query ``i`` sees key ``j`` only when ``j <= i`` (a decoder's mask); False (the
            article): every key.
        qk_norm: an RMSNorm over the head size on every query and key head, before the
            product (``q_norm`` and ``k_norm``, one weight of D each); False (the article):
            none. ``norm_eps``: its epsilon.
        disentangled: DeBERTa's relative terms, ``("c2p", "p2c")`` or one of them
            (:mod:`bertattn.attention.disentangled`); every call then takes the relative
            position table as ``rel_embeddings=``, and the scores' scale becomes
            ``1 / sqrt(D * (1 + #terms))``. None (the article): none. ``position_buckets``,
            ``max_relative_positions``: the config's, the span ``S`` being the buckets when
            > 0, else ``max_relative_positions`` (>= 1). ``share_att_key``: the position table
            projected by ``q_linear`` / ``k_linear`` (DeBERTa-v3); False: by
            ``pos_query_proj`` / ``pos_key_proj`` of their own.

    Shapes: ``q_linear`` ``(H * D, E)``, ``k_linear`` and ``v_linear`` ``(Hkv * D, E)``,
    ``out_linear`` ``(E, H * D)``. With every option left out they are the article's four
    ``(E, E)`` projections, and rotation and window add no parameter: the state dict is the
    article's, so ``load_state_dict(article_module.state_dict(), strict=True)`` works. For
    self-attention the three input projections run as one GEMM: their weights share one
    contiguous ``((H + 2 Hkv) D, E)`` storage, so the fused weight costs no copy and no extra
    memory.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        *,
        bias: bool = True,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        rotary_theta: float | None = None,
        window: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        scale: float | None = None,
        causal: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        disentangled: tuple[str, ...] | None = None,
        position_buckets: int = -1,
        max_relative_positions: int = -1,
        share_att_key: bool = True,
    ) -> None:
        super().__init__()
        embed_dim, num_heads = _check_widths(embed_dim, num_heads, dropout, backend)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim, self.num_kv_heads = _check_heads(embed_dim, num_heads, head_dim,
                                                        num_kv_heads)  # fmt: skip
        self.backend = backend
        self.window = check_window(window)
        self.scale = _check_scale(scale)
        self.causal = check_bool(causal, "causal")
        if self.causal and self.window is not None:
            raise ValueError(
                f"causal=True with window={self.window} is not supported (a causal local "
                f"window); build the module with one of them."
            )
        self.rotary_theta = None if rotary_theta is None else float(rotary_theta)
        if self.rotary_theta is not None:  # checked now: an odd head size cannot rotate (on
            inverse_frequencies(self.head_dim, self.rotary_theta, device="cpu")  # the CPU: meta's
            # arange would import torch._dynamo, see _cat)
        factory = {"device": device, "dtype": dtype}
        inner, kv = num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_linear = nn.Linear(embed_dim, inner, bias=bias, **factory)
        self.k_linear = nn.Linear(embed_dim, kv, bias=bias, **factory)
        self.v_linear = nn.Linear(embed_dim, kv, bias=bias, **factory)
        self.out_linear = nn.Linear(inner, embed_dim, bias=bias, **factory)
        if check_bool(qk_norm, "qk_norm"):  # q_norm / k_norm: Qwen3's and Gemma 3's names
            self.q_norm = nn.RMSNorm(self.head_dim, eps=norm_eps, **factory)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=norm_eps, **factory)
        self.dropout = nn.Dropout(dropout)
        self._disentangle(disentangled, position_buckets, max_relative_positions, share_att_key)
        #: the article's shape: none of the options that change the formula (fastcall.py)
        self._article = (
            inner == embed_dim == kv and not (self.causal or qk_norm) and self.scale is None
        )
        self.last_dispatch = None  # a property: the Dispatch is built when first read
        self._packed_weight: Tensor | None = None
        self._packed_bias: Tensor | None = None
        self._packed_ptrs: list[int] = []
        self._pack_qkv()
        self.register_load_state_dict_post_hook(MultiHeadAttention._repack_after_load)

    # ------------------------------------------------------------------ disentangled positions
    def _disentangle(
        self, terms: object, buckets: int, max_relative: int, share_att_key: bool
    ) -> None:
        """Set up DeBERTa's relative terms (see ``disentangled`` in the class docstring)."""
        self.disentangled: tuple[str, ...] = ()
        if terms is None:
            return
        if (
            isinstance(terms, str)
            or not isinstance(terms, (tuple, list))
            or not terms
            or any(t not in TERMS for t in terms)
        ):
            raise ValueError(
                f"disentangled must be a tuple of relative terms from {TERMS}, got {terms!r}; "
                f"e.g. disentangled=('c2p', 'p2c') as DeBERTa-v3's pos_att_type."
            )
        span = buckets if buckets > 0 else max_relative
        if not is_int(span) or span < 1:
            raise ValueError(
                f"disentangled attention needs position_buckets > 0 or max_relative_positions "
                f">= 1 (the span of the relative table), got {buckets} and {max_relative}; "
                f"pass the config's max_position_embeddings as max_relative_positions."
            )
        if self.num_kv_heads != self.num_heads or self.scale is not None:
            raise ValueError(
                "disentangled attention takes no num_kv_heads and no scale of its own (its "
                "scale is 1/sqrt(head_dim * (1 + #terms))); leave them out."
            )
        self.disentangled = tuple(t for t in TERMS if t in terms)
        self.position_buckets, self.max_relative_positions = buckets, max_relative
        self.relative_span = int(span)
        self.share_att_key = check_bool(share_att_key, "share_att_key")
        self.scale = content_scale(self.head_dim, len(self.disentangled))
        inner = self.num_heads * self.head_dim
        ref = self.q_linear.weight
        factory = {"device": ref.device, "dtype": ref.dtype}
        if not self.share_att_key and "c2p" in self.disentangled:
            self.pos_key_proj = nn.Linear(self.embed_dim, inner, **factory)
        if not self.share_att_key and "p2c" in self.disentangled:
            self.pos_query_proj = nn.Linear(self.embed_dim, inner, **factory)

    def relative_terms(self, rel_embeddings: Tensor, q_len: int, k_len: int) -> RelativeTerms:
        """This layer's disentangled position input for ``q_len`` queries and ``k_len`` keys:
        the table ``(>= 2S, E)`` projected into position queries and keys ``(H, 2S, D)`` and
        the indices of every pair's relative position (:mod:`.disentangled`)."""
        span, h, d = self.relative_span, self.num_heads, self.head_dim
        table = rel_embeddings[: 2 * span]  # (2S, E)
        shared = self.share_att_key
        pos_q = pos_k = None
        if "c2p" in self.disentangled:
            lin = self.k_linear if shared else self.pos_key_proj
            pos_k = _fast.linear(lin, table).view(-1, h, d).transpose(0, 1)  # (H, 2S, D)
        if "p2c" in self.disentangled:
            lin = self.q_linear if shared else self.pos_query_proj
            pos_q = _fast.linear(lin, table).view(-1, h, d).transpose(0, 1)  # (H, 2S, D)
        where = {"buckets": self.position_buckets, "max_position": self.max_relative_positions,
                 "device": table.device}  # fmt: skip
        rel = relative_buckets(q_len, k_len, **where)  # (Lq, Lk): bucket(i - j)
        back = relative_buckets(k_len, q_len, **where)  # (Lk, Lq): bucket(j - i)
        top = 2 * span - 1
        c2p_index = (rel + span).clamp(0, top)
        p2c_index = (span - back).clamp(0, top)
        return RelativeTerms(pos_q, pos_k, c2p_index, p2c_index, self.scale)  # type: ignore[arg-type]

    def _relative_for(
        self, x: Tensor, key_value: Tensor | None, rel_embeddings: Tensor | None
    ) -> RelativeTerms | None:
        """:meth:`relative_terms` for one :meth:`forward` call, ``rel_embeddings`` checked."""
        if not self.disentangled:
            if rel_embeddings is not None:
                raise ValueError(
                    "rel_embeddings= was given, but this module has no disentangled positions; "
                    "build it with disentangled=('c2p', 'p2c'), or leave rel_embeddings out."
                )
            return None
        want = (2 * self.relative_span, self.embed_dim)
        if (
            not isinstance(rel_embeddings, Tensor)
            or rel_embeddings.dim() != 2
            or rel_embeddings.size(0) < want[0]
            or rel_embeddings.size(1) != want[1]
        ):
            got = (
                tuple(rel_embeddings.shape)
                if isinstance(rel_embeddings, Tensor)
                else describe(rel_embeddings)
            )
            raise ValueError(
                f"this module has disentangled positions: rel_embeddings must be the relative "
                f"position table of shape {want} (2 * span rows, embed_dim wide), got {got}."
            )
        k_len = x.size(1) if key_value is None else key_value.size(1)
        return self.relative_terms(rel_embeddings.to(x.dtype), x.size(1), k_len)

    # ------------------------------------------------------------------ fused QKV storage
    def _qkv_linears(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return self.q_linear, self.k_linear, self.v_linear

    @torch.no_grad()
    def _pack_qkv(self) -> None:
        """Move the q/k/v weights (and biases) into one contiguous ``((H + 2 Hkv) D, E)``
        storage (``(3E, E)`` for the article's shape)."""
        lins = self._qkv_linears()
        ends = np.cumsum([0, *self._qkv_rows()]).tolist()  # where q, k, v start and end
        weight = _cat([lin.weight for lin in lins])  # ((H + 2 Hkv) D, E)
        for i, lin in enumerate(lins):
            lin.weight.data = weight[ends[i] : ends[i + 1]]
        self._packed_weight = weight
        self._packed_bias = None
        if lins[0].bias is not None:
            bias = _cat([lin.bias for lin in lins])  # ((H + 2 Hkv) D,)
            for i, lin in enumerate(lins):
                lin.bias.data = bias[ends[i] : ends[i + 1]]
            self._packed_bias = bias
        self._packed_ptrs = [t.data_ptr() for t in self._qkv_tensors()]  # where they must stay

    def _qkv_rows(self) -> tuple[int, int, int]:
        """The output sizes of q, k and v: ``(H D, Hkv D, Hkv D)``."""
        inner, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return inner, kv, kv

    def _qkv_tensors(self) -> tuple[Tensor, ...]:
        out = []
        for name in _QKV_NAMES:  # plain dict reads: nn.Module.__getattr__ is slow per call
            lin = _fast.submodule(self, name)
            w = _fast.param(lin, "weight")
            b = _fast.param(lin, "bias")
            out.append(w)
            if b is not None:
                out.append(b)
        return tuple(out)  # type: ignore[arg-type]

    def _still_packed(self) -> bool:
        """Whether q/k/v still live in the packed storage (cheap: compares data pointers)."""
        packed = self._packed_weight
        if packed is None:
            return False
        mods = self._modules
        try:  # the usual case, unrolled: three nn.Linear with their parameters in place
            q = mods["q_linear"]._parameters  # type: ignore[union-attr]
            k = mods["k_linear"]._parameters  # type: ignore[union-attr]
            v = mods["v_linear"]._parameters  # type: ignore[union-attr]
            qw, kw, vw = q["weight"], k["weight"], v["weight"]
            qb, kb, vb = q["bias"], k["bias"], v["bias"]
        except KeyError:
            qb = _MISSING
        if qb is _MISSING or qw is None or qb is None or kb is None or vb is None:
            tensors = self._qkv_tensors()
            if tensors[0].dtype != packed.dtype:
                return False
            return [t.data_ptr() for t in tensors] == self._packed_ptrs
        return qw.dtype == packed.dtype and self._packed_ptrs == [
            qw.data_ptr(),
            qb.data_ptr(),
            kw.data_ptr(),
            kb.data_ptr(),
            vw.data_ptr(),
            vb.data_ptr(),
        ]

    def __setstate__(self, state: dict) -> None:
        # copy.deepcopy and pickling (torch.save / torch.load) copy each parameter on its own,
        # so q/k/v come back in three storages: pack them again, or every call would
        # concatenate the weights (about a fifth of a MiniLM query's time)
        super().__setstate__(state)
        if "_packed_weight" in self.__dict__ and not self._still_packed():
            self._pack_qkv()

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        out = super()._apply(fn, recurse)
        self._pack_qkv()  # .to() / .half() / .cuda() gave new storages: pack them again
        return out

    @staticmethod
    def _repack_after_load(module: MultiHeadAttention, incompatible_keys: object) -> None:
        # a post-hook, not _load_from_state_dict: that runs before the children (q_linear, ...)
        # load, so it cannot see load_state_dict(assign=True) replacing their tensors
        if not module._still_packed():
            module._pack_qkv()

    def qkv_weight(self) -> tuple[Tensor, Tensor | None]:
        """The fused ``(3E, E)`` weight and ``(3E,)`` bias of the q, k, v projections
        (``((H + 2 Hkv) D, E)`` and ``((H + 2 Hkv) D,)`` with grouped heads or a head size
        other than ``E / H``).

        Without autograd this is the shared storage itself (no copy); with autograd, or when a
        parameter was replaced behind the module's back, a ``torch.cat`` that gradients flow
        through.
        """
        needs_graph = torch.is_grad_enabled() and any(t.requires_grad for t in self._qkv_tensors())
        if not needs_graph and not torch.compiler.is_compiling() and self._still_packed():
            return self._packed_weight, self._packed_bias  # type: ignore[return-value]
        lins = self._qkv_linears()
        weight = torch.cat([lin.weight for lin in lins])
        bias = None if lins[0].bias is None else torch.cat([lin.bias for lin in lins])
        return weight, bias

    # ------------------------------------------------------------------ checks
    def _check_input(self, name: str, t: Tensor, batched: bool) -> None:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        want = 3 if batched else 2
        if t.dim() != want:
            form = "(batch, seq_len, embed_dim)" if batched else "(seq_len, embed_dim)"
            raise ValueError(
                f"{name} has shape {_shape(t)}; expected {want}-D {form} like x "
                f"with embed_dim={self.embed_dim}."
            )
        if t.size(-1) != self.embed_dim:
            raise ValueError(
                f"{name} has width {t.size(-1)} (shape {_shape(t)}); this module was built with "
                f"embed_dim={self.embed_dim}. Project it to {self.embed_dim} first."
            )
        w = self.out_linear.weight
        if t.dtype != w.dtype:
            raise ValueError(
                f"{name} has dtype {t.dtype} but the module's weights are {w.dtype}; call "
                f"module.to({t.dtype}) or pass {name}.to({w.dtype})."
            )
        if t.device != w.device:
            raise ValueError(
                f"{name} is on {t.device} but the module is on {w.device}; move one of them."
            )

    def _case(
        self, x: Tensor, key_value: Tensor | None, need_weights: bool, dropout_p: float
    ) -> tuple[object, ...] | None:
        """What forward's checks and ``auto`` decision depend on (None: not memoizable)."""
        kv_sig = None
        if key_value is not None:
            if not isinstance(key_value, Tensor):
                return None
            kv_sig = (key_value.shape, key_value.dtype, key_value.device)
        table = _policy.TABLE
        if _CASES_TABLE[0] is not table:  # a new policy table: decide everything again
            _CASES.clear()
            _CASES_TABLE[0] = table
        try:
            w = self._modules["out_linear"]._parameters["weight"]  # type: ignore[union-attr]
        except KeyError:
            w = self.out_linear.weight
        return (
            x.shape,
            x.dtype,
            x.device,
            kv_sig,
            w.dtype,
            w.device,
            self.embed_dim,
            self.num_heads,
            self.backend,
            need_weights,
            dropout_p > 0.0,
        )

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        key_value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        attn_bias: Tensor | None = None,
        need_weights: bool = True,
        positions: Tensor | None = None,
        rel_embeddings: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to itself (or to ``key_value``).

        Args:
            x: ``(B, Lq, E)``, or unbatched ``(Lq, E)``.
            mask: broadcastable to ``(B, H, Lq, Lk)``; nonzero / True = attend (the article).
            key_value: ``(B, Lk, E)`` for cross-attention; defaults to ``x``.
            key_padding_mask: ``(B, Lk)``; 1 / True = real token, 0 / False = padding.
            attn_bias: float, broadcastable to ``(B, H, Lq, Lk)``, added to the scores.
            need_weights: return the ``(B, H, Lq, Lk)`` attention (forces the math backend
                under ``auto``); False lets a fused backend run in O(L) memory.
            positions: ``(Lq,)`` or ``(B, Lq)`` integer positions for ``rotary_theta``
                (default ``0..Lq-1``); refused when the module does not rotate.
            rel_embeddings: ``(2S, E)`` (or longer) relative position table for a
                ``disentangled`` module (DeBERTa's, after its norm); refused otherwise.

        Returns:
            ``(output, attention)``: output ``(B, Lq, E)``; attention ``(B, H, Lq, Lk)`` or
            None. A query row with no key to attend to gets zero weights and zero context.
        """
        if (  # the commonest call, computed the same way with less Python (fastcall.py)
            need_weights is False
            and mask is None
            and key_value is None
            and attn_bias is None
            and positions is None
            and rel_embeddings is None
        ):
            fast = _fast.self_attention(self, x, key_padding_mask)
            if fast is not None:
                return fast
        if not isinstance(x, Tensor):
            raise ArgumentTypeError(f"x must be a torch.Tensor, got {type(x).__name__}.")
        unbatched = x.dim() == 2
        dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        compiling = torch.compiler.is_compiling()
        if not isinstance(need_weights, bool):  # a key of the decision's memo: checked first
            need_weights = check_bool(need_weights, "need_weights")  # type: ignore[assignment]
        x, key_value, (name, reason) = self._decide(x, key_value, need_weights, dropout_p)
        if unbatched and isinstance(key_padding_mask, Tensor) and key_padding_mask.dim() == 1:
            key_padding_mask = key_padding_mask.unsqueeze(0)
        spec = get_backend(name)
        # the seam: every position scheme of this call as data (rotation, window), then the mask
        inputs = self._inputs(x, key_value, positions, spec, key_padding_mask, rel_embeddings)
        prepared = self._prepare(x, key_value, mask, key_padding_mask, attn_bias, inputs, spec)
        if spec.layout == "packed":
            extra = (("mask", mask), ("attn_bias", attn_bias), ("key_value", key_value))
            out, weights = self._forward_packed(
                x, key_padding_mask, name, reason, extra=extra, need_weights=need_weights,
                inputs=inputs,
            )  # fmt: skip
        else:
            out, weights = self._attend_padded(
                x, prepared, key_value, need_weights, self.backend, name, reason, dropout_p,
                compiling=compiling, spec=spec, inputs=inputs,
            )  # fmt: skip
        if unbatched:
            out = out.squeeze(0)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _decide(
        self, x: Tensor, key_value: Tensor | None, need_weights: bool, dropout_p: float
    ) -> tuple[Tensor, Tensor | None, tuple[str, str]]:
        """Check ``x`` and ``key_value`` and decide the backend: ``(x, key_value, (name,
        reason))``, both inputs batched (an unbatched ``(L, E)`` becomes ``(1, L, E)``).

        Every check here depends on shapes, dtypes, devices and flags only: a case that passed
        once skips them (a failing case is never stored, so it raises every time)."""
        unbatched = x.dim() == 2
        case = None if torch.compiler.is_compiling() else self._case(
            x, key_value, need_weights, dropout_p
        )  # fmt: skip
        decision = None if case is None else _CASES.get(case)
        if decision is None:
            self._check_input("x", x, batched=not unbatched)
            if key_value is not None:
                self._check_input("key_value", key_value, batched=not unbatched)
        if unbatched:
            x = x.unsqueeze(0)
            key_value = None if key_value is None else key_value.unsqueeze(0)
        if decision is not None:
            return x, key_value, decision
        if key_value is not None and key_value.size(0) != x.size(0):
            raise ValueError(
                f"key_value has batch size {key_value.size(0)} but x has {x.size(0)}; "
                f"they must match."
            )
        decision = choose_backend(
            self.backend,
            need_weights=need_weights,
            device_type=x.device.type,
            dtype=x.dtype,
            key_len=x.size(1) if key_value is None else key_value.size(1),
            training=dropout_p > 0.0,
        )
        get_backend(decision[0])  # an unknown name is refused before the masks are looked at
        if case is not None:
            if len(_CASES) > 256:
                _CASES.clear()
            _CASES[case] = decision
        return x, key_value, decision

    def _inputs(
        self,
        x: Tensor,
        key_value: Tensor | None,
        positions: Tensor | None,
        spec: BackendSpec,
        key_padding_mask: Tensor | None,
        rel_embeddings: Tensor | None = None,
    ) -> AttentionInputs:
        """This module's position schemes for one :meth:`forward` call, as data."""
        rotation = self._rotation(x, key_value, positions, packed=spec.layout == "packed",
                                  key_padding_mask=key_padding_mask)  # fmt: skip
        if self.window is not None and key_value is not None:
            raise ValueError(
                "a local window is for self-attention: key_value= cannot be given to a module "
                "built with window=."
            )
        relative = self._relative_for(x, key_value, rel_embeddings)
        if rotation is None and self.window is None and relative is None:
            return NO_INPUTS
        return AttentionInputs(rotation=rotation, window=self.window, relative=relative)

    def _prepare(
        self,
        x: Tensor,
        key_value: Tensor | None,
        mask: Tensor | None,
        key_padding_mask: Tensor | None,
        attn_bias: Tensor | None,
        inputs: AttentionInputs,
        spec: BackendSpec,
    ) -> PreparedMask | WindowedMask:
        """The mask arguments validated and folded into one bias (whichever backend runs);
        for a padded backend with a window, the window beside it (masked or exploited)."""
        batch, q_len, _ = x.shape
        if mask is None and key_padding_mask is None and attn_bias is None:
            prepared = _NO_MASK
        else:
            prepared = prepare_mask(
                mask,
                key_padding_mask,
                attn_bias,
                batch=batch,
                heads=self.num_heads,
                query_len=q_len,
                key_len=q_len if key_value is None else key_value.size(1),
                dtype=x.dtype,
                device=x.device,
            )
        if inputs.window is not None and spec.layout != "packed":
            return WindowedMask(prepared, inputs.window, q_len, heads=self.num_heads,
                                dtype=x.dtype)  # fmt: skip
        return prepared

    def _rotation(
        self,
        x: Tensor,
        key_value: Tensor | None,
        positions: Tensor | None,
        *,
        packed: bool,
        key_padding_mask: Tensor | None,
    ) -> Rotation | None:
        """The rotation :meth:`forward` applies (None without ``rotary_theta``): ``(Lq, D)`` or
        ``(B, 1, Lq, D)`` tables, or ``(T, 1, D)`` for a packed backend (the positions of the
        real tokens, in order)."""
        theta = self.rotary_theta
        if theta is None:
            if positions is not None:
                raise ValueError(
                    "positions= was given, but this module has no rotary positions; build it "
                    "with rotary_theta=... (e.g. 10000.0), or leave positions out."
                )
            return None
        if key_value is not None:
            raise ValueError(
                "rotary positions are for self-attention: key_value= cannot be given to a "
                "module built with rotary_theta."
            )
        b, q_len = x.shape[0], x.shape[1]
        if positions is None:
            positions = torch.arange(q_len, device=x.device)
        elif (
            not isinstance(positions, Tensor)
            or positions.is_floating_point()
            or tuple(positions.shape) not in ((q_len,), (b, q_len))
        ):
            got = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions)
            raise ValueError(
                f"positions must be an integer tensor of shape ({q_len},) or ({b}, {q_len}), "
                f"got {got}."
            )
        inv = inverse_frequencies(self.head_dim, theta, device=x.device)
        if packed:
            keep = (
                torch.ones(b, q_len, dtype=torch.bool, device=x.device)
                if key_padding_mask is None
                else key_padding_mask.to(device=x.device, dtype=torch.bool)
            )
            return rotation_for_packed(positions.expand(b, q_len)[keep], inv, theta)
        rot = rotation_for_positions(positions, inv, theta)
        if rot.cos.dim() == 3:  # (B, Lq, D) -> (B, 1, Lq, D): one table per row, every head
            rot = Rotation(rot.cos.unsqueeze(1), rot.sin.unsqueeze(1), rot.theta)
        return rot

    def project_qkv(self, x: Tensor, key_value: Tensor | None = None) -> tuple[Tensor, ...]:
        """Q ``(B, H, Lq, D)``, K and V ``(B, Hkv, Lk, D)`` split into heads, one GEMM for
        self-attention; with ``qk_norm``, q and k normalized per head."""
        b, lq, _ = x.shape
        h, d = self.num_heads, self.head_dim
        weight, bias = self.qkv_weight()
        if key_value is None and self._article:
            qkv = self._project(x, weight, bias)  # (B, L, 3E)
            qkv = qkv.view(b, lq, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, H, L, D)
            return tuple(qkv.unbind(0))
        if key_value is None:
            q, k, v = self._split_heads(self._project(x, weight, bias))  # (B, L, H|Hkv, D)
        else:
            e = self._qkv_rows()[0]
            q = F.linear(x, weight[:e], None if bias is None else bias[:e])  # (B, Lq, H D)
            q = q.view(b, lq, h, d)
            kv = F.linear(key_value, weight[e:], None if bias is None else bias[e:])
            _, k, v = self._split_heads(kv, with_q=False)  # (B, Lk, Hkv, D) each
        q, k = self._normed(q, k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H|Hkv, L, D)

    def _project(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """The fused q/k/v product ``(..., E)`` -> ``(..., (H + 2 Hkv) D)``: ``qkv_product``
        when one was installed (int8: :mod:`bertattn.encoder.int8_blocks`), else ``x @ W.T + b``."""
        product = self._modules.get("qkv_product")
        return _prepack.linear(x, weight, bias) if product is None else product(x)

    def _split_heads(self, qkv: Tensor, *, with_q: bool = True) -> tuple[Tensor | None, ...]:
        """``(..., (H + 2 Hkv) D)`` (or ``(..., 2 Hkv D)`` without q) -> q ``(..., H, D)``
        (None without it), k and v ``(..., Hkv, D)``: views, no copy."""
        rows = self._qkv_rows() if with_q else self._qkv_rows()[1:]
        parts = qkv.split(list(rows), dim=-1)
        lead = qkv.shape[:-1]
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)[3 - len(rows) :]
        views = [p.view(*lead, n, self.head_dim) for p, n in zip(parts, heads, strict=True)]
        return (*views,) if with_q else (None, *views)

    def _normed(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """With ``qk_norm``: an RMSNorm over the head size of every query and key head,
        before the product (their last dimension is D); else ``q, k`` as they are."""
        mods = self._modules
        if "q_norm" not in mods:
            return q, k
        return mods["q_norm"](q), mods["k_norm"](k)  # type: ignore[misc]

    def attend(
        self,
        x: Tensor,
        prepared: PreparedMask | WindowedMask,
        *,
        key_value: Tensor | None = None,
        need_weights: bool = False,
        backend: str | None = None,
        rotation: Rotation | None = None,
        relative: RelativeTerms | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The core of :meth:`forward` for callers that prepared the mask once (an encoder).

        ``x`` is ``(B, Lq, E)`` and already checked; ``prepared`` comes from
        :func:`bertattn.attention.masks.prepare_mask`. ``backend`` overrides ``self.backend``.
        A packed backend cannot run here (it needs :meth:`attend_packed`). ``rotation``: the
        rotary tables for the queries and keys (:mod:`.rotary`; computed once per forward by
        the caller). A local window comes as ``prepared``, a
        :class:`~bertattn.attention.window.WindowedMask`: ``sdpa`` skips the keys out of reach
        on a sequence long enough for it to pay (exploited), ``math`` and the other backends
        add the band to the mask (masked); ``explain()`` says which. ``relative``: a
        ``disentangled`` module's terms (:meth:`relative_terms`, once per forward and layer).
        """
        requested = self.backend if backend is None else backend
        dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        name, reason = choose_backend(
            requested,
            need_weights=need_weights,
            device_type=x.device.type,
            dtype=x.dtype,
            key_len=x.size(1) if key_value is None else key_value.size(1),
            training=dropout_p > 0.0,
        )
        if get_backend(name).layout == "packed":
            raise ValueError(
                f"backend {name!r} works on packed tokens: call attend_packed(x_packed, packed), "
                f"or forward(x, key_padding_mask=...), which packs for you."
            )
        return self._attend_padded(
            x,
            prepared,
            key_value,
            need_weights,
            requested,
            name,
            reason,
            dropout_p,
            inputs=AttentionInputs(rotation=rotation, relative=relative),
        )

    def _record(
        self, requested: str, name: str, reason: str, q: Tensor, compiling: bool | None = None
    ) -> None:
        if torch.compiler.is_compiling() if compiling is None else compiling:
            return  # a compiled graph replays one fixed decision
        if recording():  # an explain() block or the DEBUG logger wants the record now
            dtype = _policy.dtype_name(q.dtype)
            decision = Dispatch(requested, name, reason, tuple(q.shape), dtype)
            self.__dict__["_last_dispatch"] = decision
            record(decision)
        else:  # nobody is looking: keep the parts; last_dispatch builds the record when read
            self.__dict__["_last_dispatch"] = (requested, name, reason, q.shape, q.dtype)

    @property
    def last_dispatch(self) -> Dispatch | None:
        """The :class:`~bertattn.attention.dispatch.Dispatch` of the latest call (None before
        the first): which backend ran, and why."""
        last = self.__dict__.get("_last_dispatch")
        if isinstance(last, tuple):
            requested, name, reason, shape, dtype = last
            last = Dispatch(requested, name, reason, tuple(shape), _policy.dtype_name(dtype))
            self.__dict__["_last_dispatch"] = last
        return last

    @last_dispatch.setter
    def last_dispatch(self, value: Dispatch | None) -> None:
        self.__dict__["_last_dispatch"] = value

    def _attend_padded(
        self,
        x: Tensor,
        prepared: PreparedMask | WindowedMask,
        key_value: Tensor | None,
        need_weights: bool,
        requested: str,
        name: str,
        reason: str,
        dropout_p: float | None = None,
        *,
        compiling: bool | None = None,
        spec: BackendSpec | None = None,
        inputs: AttentionInputs = NO_INPUTS,
    ) -> tuple[Tensor, Tensor | None]:
        """Project, apply ``inputs`` (the seam), run the backend, merge the heads, project out.
        A window comes in ``prepared`` (a :class:`WindowedMask`): masked or exploited here."""
        causal = self.causal
        prepared, window, exploit = _window_plan(  # a causal call: the band masked
            prepared, name, need_weights or causal or inputs.relative is not None, key_value, x
        )
        inputs = self._own(inputs if window is None else replace(inputs, window=window))
        if compiling is None:
            compiling = torch.compiler.is_compiling()
        if spec is None:
            spec = get_backend(name)
        if need_weights and not spec.returns_weights:
            raise ValueError(
                f"backend {name!r} does not return attention weights; pass need_weights=False, "
                f"or use backend='math' (or 'auto', which picks math when weights are needed)."
            )
        check_inputs(spec, inputs)
        if causal:  # query i sees keys j <= i: the triangle added to the mask
            prepared = self._causal_mask(prepared, x, key_value)
        q, k, v = self.project_qkv(x, key_value)
        rec = None if compiling or not _steps._open_blocks else steps_recorder()
        q, k = _positioned(q, k, inputs, rec)
        reason = _describe(reason, inputs, name, self.num_heads, "q_norm" in self._modules)
        if window is not None:
            reason = f"{reason}; window {window}: {_WINDOW_HOW[exploit]}"
        if dropout_p is None:
            dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        out_linear = _fast.submodule(self, "out_linear")
        if rec is not None:  # attention.steps: the input and projection of the next record
            rec.note_module(x, out_linear.weight, out_linear.bias)
        if exploit:
            context = local_attention(
                q, k, v, window, dropout_p=dropout_p, key_bias=prepared.bias, scale=inputs.scale
            )  # (B, H, Lq, D); a query with no key in reach: zeros
            weights = None
        else:
            context, weights = spec.fn(
                q, k, v, prepared.bias, dropout_p=dropout_p, need_weights=need_weights,
                **inputs.backend_kwargs("padded"),
            )  # (B, H, Lq, D), (B, H, Lq, Lk) | None; k, v (B, Hkv, Lk, D)  # fmt: skip
        live = prepared.live_rows
        if live is not None:  # rows with no key at all: zero weights, zero context
            context = context.masked_fill(~live, 0.0)
            weights = None if weights is None else weights.masked_fill(~live, 0.0)
        output = self._merge_out(context, out_linear, compiling)
        self._record(requested, name, reason, q, compiling)
        return output, weights

    def _causal_mask(
        self, prepared: PreparedMask, x: Tensor, key_value: Tensor | None
    ) -> PreparedMask:
        """``prepared`` with the causal triangle added: query ``i`` sees keys ``j <= i``."""
        return add_causal(
            prepared,
            heads=self.num_heads,
            query_len=x.size(1),
            key_len=x.size(1) if key_value is None else key_value.size(1),
            dtype=x.dtype,
            device=x.device,
        )

    def _own(self, inputs: AttentionInputs) -> AttentionInputs:
        """``inputs`` with what this module itself changes in the formula: the causal mask,
        the scores' scale, key/value heads shared by the query heads."""
        if self._article:
            return inputs
        if self.disentangled and inputs.relative is None:
            raise ValueError(
                "this module has disentangled positions (DeBERTa): forward takes "
                "rel_embeddings=, attend() and attend_packed() take "
                "relative=module.relative_terms(rel_embeddings, q_len, k_len)."
            )
        shared = self.num_kv_heads != self.num_heads
        return replace(inputs, causal=self.causal, scale=self.scale,
                       kv_heads=self.num_kv_heads if shared else None)  # fmt: skip

    def _merge_out(self, context: Tensor, out_linear: nn.Module, compiling: bool) -> Tensor:
        """Merge the heads ``(B, H, Lq, D)`` -> ``(B, Lq, H * D)`` and project them out."""
        b, h, lq, d = context.shape
        context = context.transpose(1, 2).reshape(b, lq, h * d)  # merge heads: (B, Lq, E)
        if type(out_linear) is nn.Linear and _fast.plain_call(out_linear, compiling):
            # exactly what the module call runs, without its per-call overhead
            params = out_linear._parameters
            return _prepack.linear(context, params["weight"], params["bias"])
        output = self.out_linear(context)  # (B, Lq, E)
        return output

    def attend_packed(
        self,
        x: Tensor,
        packed: PackedBatch,
        *,
        backend: str = "varlen",
        reason: str = "asked for explicitly",
        requested: str | None = None,
        bias: tuple[Tensor | None, ...] | None = None,
        rotation: Rotation | None = None,
        window: int | None = None,
        relative: RelativeTerms | None = None,
    ) -> Tensor:
        """Self-attention over packed real tokens: ``x`` ``(T, E)`` -> ``(T, E)``.

        ``packed`` comes from :func:`bertattn.attention.padding.pack_padding_mask`; each
        sequence attends only to its own tokens. ``bias``: an additive bias per sequence, one
        ``(1, H, l, l)`` block each (None for an empty sequence), added to its scaled scores
        (MPNet's relative position bias); only a backend registered with ``packed_bias=True``
        takes one (``varlen``). ``rotation``: ``(T, 1, D)`` rotary tables, positions restarting
        at 0 in every sequence (:func:`bertattn.attention.rotary.rotation_for_packed`);
        ``window``: local attention within each sequence (never across two), only on a backend
        registered with ``packed_window=True``. ``relative``: a ``disentangled`` module's terms
        (:meth:`relative_terms` for the longest sequence; every sequence reads its corner).
        """
        inputs = AttentionInputs(rotation=rotation, window=window, bias=bias, relative=relative)
        return self._attend_packed(x, packed, backend, reason, requested or backend, inputs)

    def _attend_packed(
        self,
        x: Tensor,
        packed: PackedBatch,
        backend: str,
        reason: str,
        requested: str,
        inputs: AttentionInputs,
    ) -> Tensor:
        """:meth:`attend_packed` with its position inputs gathered: the seam's packed side."""
        spec = get_backend(backend)
        if spec.layout != "packed":
            raise ValueError(f"backend {backend!r} is not a packed backend; use attend().")
        inputs = self._own(inputs)
        check_inputs(spec, inputs)
        t = x.size(0)
        h, d = self.num_heads, self.head_dim
        weight, qkv_bias = self.qkv_weight()
        qkv = self._project(x, weight, qkv_bias)  # (T, (H + 2 Hkv) D)
        if self._article:
            q, k, v = qkv.view(t, 3, h, d).unbind(1)  # (T, H, D) each
        else:
            q, k, v = self._split_heads(qkv)  # (T, H, D), (T, Hkv, D), (T, Hkv, D)
            q, k = self._normed(q, k)  # type: ignore[arg-type]
        q, k = _positioned(q, k, inputs, None)
        reason = _describe(reason, inputs, backend, h, "q_norm" in self._modules)
        dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        context = spec.fn(q, k, v, packed, dropout_p=dropout_p, **inputs.backend_kwargs("packed"))
        if inputs.window is not None:  # (T, H, D); say what the window and bias left
            reason = f"{reason}; {_window_note(packed, inputs.window)}"
        elif inputs.bias is not None and backend == "varlen":
            reason = f"{reason}; {_varlen_bias_note(q, dropout_p)}"
        output = _fast.linear(_fast.submodule(self, "out_linear"), context.reshape(t, h * d))
        self._record(requested, backend, reason, q)
        return output

    def _forward_packed(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        name: str,
        reason: str,
        *,
        extra: tuple[tuple[str, Tensor | None], ...],
        need_weights: bool,
        inputs: AttentionInputs = NO_INPUTS,
    ) -> tuple[Tensor, None]:
        given = [arg for arg, value in extra if value is not None]
        if given or need_weights:
            what = ", ".join(given + (["need_weights=True"] if need_weights else []))
            raise ValueError(
                f"backend {name!r} takes self-attention with key_padding_mask only, got {what}; "
                f"use backend='sdpa' (or 'auto') for other masks, or 'math' for weights."
            )
        b, length, _ = x.shape  # key_padding_mask was validated by forward's prepare_mask
        if key_padding_mask is None:
            key_padding_mask = torch.ones(b, length, dtype=torch.bool, device=x.device)
        packed = pack_padding_mask(key_padding_mask.to(x.device))
        out = self._attend_packed(unpad(x, packed), packed, name, reason, self.backend, inputs)
        return pad(out, packed), None  # (B, L, E); zeros at padding positions

    # ------------------------------------------------------------------ interop
    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention, *, backend: str = "auto") -> MultiHeadAttention:
        """Copy a ``torch.nn.MultiheadAttention``'s weights into a new (batch-first) module.

        The result always takes ``(B, L, E)`` input: for a source built with
        ``batch_first=False`` transpose your ``(L, B, E)`` tensors. Remember that torch's
        ``key_padding_mask`` is True for padding, bertattn's is True for a real token.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise ValueError(
                f"from_torch expects torch.nn.MultiheadAttention, got {type(m).__name__}."
            )
        if not m._qkv_same_embed_dim:
            raise ValueError(
                f"from_torch supports kdim == vdim == embed_dim only; got kdim={m.kdim}, "
                f"vdim={m.vdim}, embed_dim={m.embed_dim}."
            )
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError(
                "from_torch does not support add_bias_kv=True or add_zero_attn=True: they add "
                "a key that bertattn's MultiHeadAttention does not have."
            )
        w = m.in_proj_weight
        new = cls(
            m.embed_dim,
            m.num_heads,
            m.dropout,
            bias=m.in_proj_bias is not None,
            backend=backend,
            device=w.device,
            dtype=w.dtype,
        )
        e = m.embed_dim
        state = {
            "q_linear.weight": w[:e],
            "k_linear.weight": w[e : 2 * e],
            "v_linear.weight": w[2 * e :],
            "out_linear.weight": m.out_proj.weight,
        }
        if m.in_proj_bias is not None:
            b = m.in_proj_bias
            state.update(
                {
                    "q_linear.bias": b[:e],
                    "k_linear.bias": b[e : 2 * e],
                    "v_linear.bias": b[2 * e :],
                    "out_linear.bias": m.out_proj.bias,
                }
            )
        new.load_state_dict({k: v.detach() for k, v in state.items()}, strict=True)
        return new

    def extra_repr(self) -> str:
        out = (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"dropout={self.dropout.p}, backend={self.backend!r}"
        )
        if self.num_kv_heads != self.num_heads:
            out += f", num_kv_heads={self.num_kv_heads}"
        if self.head_dim * self.num_heads != self.embed_dim:
            out += f", head_dim={self.head_dim}"
        if self.scale is not None:
            out += f", scale={self.scale:g}"
        return out + (", causal=True" if self.causal else "")
