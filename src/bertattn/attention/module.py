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
from .dispatch import Dispatch, choose_backend, record, recording
from .inputs import NO_INPUTS, AttentionInputs, check_inputs
from .masks import PreparedMask, prepare_mask
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
    from .backends import VARLEN_BIAS_WHY, _cuda_varlen

    if dropout_p == 0.0 and _cuda_varlen(q) is not None:
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


def _describe(reason: str, inputs: AttentionInputs) -> str:
    """``reason`` with what the call's position inputs did to q and k, for ``explain()``."""
    if inputs.rotation is not None:
        reason = f"{reason}; {inputs.rotation.describe()}"
    return reason


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


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the article's API: ``forward(x, mask) -> (output, attention)``.

    Args:
        embed_dim: model width E; must be divisible by ``num_heads``.
        num_heads: number of heads H.
        dropout: dropout probability on the attention probabilities (training only).
        bias: whether the four projections have a bias.
        backend: ``"auto"`` or a registered backend name (``"math"``, ``"sdpa"``, ...).
        rotary_theta: rotate queries and keys by their positions before the scores (rotary
            position embeddings with this base, e.g. 10000.0; :mod:`bertattn.attention.rotary`);
            None (the article): no rotation.
        window: local attention, query ``i`` sees key ``j`` only when ``|i - j| <= window``
            (:mod:`bertattn.attention.window`); None (the article): every key.

    Neither option adds a parameter: the state dict is the article's with or without them.

    The parameters are ``q_linear``, ``k_linear``, ``v_linear`` and ``out_linear`` as in the
    article, so ``load_state_dict(article_module.state_dict(), strict=True)`` works. For
    self-attention the three input projections run as one GEMM: their weights share one
    contiguous ``(3E, E)`` storage, so the fused weight costs no copy and no extra memory.
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
    ) -> None:
        super().__init__()
        if not is_int(embed_dim) or not is_int(num_heads):
            raise ArgumentTypeError(
                f"embed_dim and num_heads must be ints, got {embed_dim!r} and {num_heads!r}."
            )
        embed_dim, num_heads = int(embed_dim), int(num_heads)
        if isinstance(dropout, (bool, np.bool_)) or not isinstance(
            dropout, (int, float, np.integer, np.floating)
        ):
            raise ArgumentTypeError(f"dropout must be a float in [0, 1), got {describe(dropout)}.")
        check_str(backend, "backend")
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads}); "
                f"for example embed_dim=64 * num_heads."
            )
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
        if backend != "auto":
            get_backend(backend)  # raises with the list of valid names
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.backend = backend
        self.window = check_window(window)
        self.rotary_theta = None if rotary_theta is None else float(rotary_theta)
        if self.rotary_theta is not None:  # checked now: an odd head size cannot rotate (on
            inverse_frequencies(self.head_dim, self.rotary_theta, device="cpu")  # the CPU: meta's
            # arange would import torch._dynamo, see _cat)
        factory = {"device": device, "dtype": dtype}
        self.q_linear = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_linear = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.v_linear = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.out_linear = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)
        self.last_dispatch = None  # a property: the Dispatch is built when first read
        self._packed_weight: Tensor | None = None
        self._packed_bias: Tensor | None = None
        self._packed_ptrs: list[int] = []
        self._pack_qkv()
        self.register_load_state_dict_post_hook(MultiHeadAttention._repack_after_load)

    # ------------------------------------------------------------------ fused QKV storage
    def _qkv_linears(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return self.q_linear, self.k_linear, self.v_linear

    @torch.no_grad()
    def _pack_qkv(self) -> None:
        """Move the q/k/v weights (and biases) into one contiguous ``(3E, E)`` storage."""
        lins = self._qkv_linears()
        weight = _cat([lin.weight for lin in lins])  # (3E, E)
        for i, lin in enumerate(lins):
            lin.weight.data = weight[i * self.embed_dim : (i + 1) * self.embed_dim]
        self._packed_weight = weight
        self._packed_bias = None
        if lins[0].bias is not None:
            bias = _cat([lin.bias for lin in lins])  # (3E,)
            for i, lin in enumerate(lins):
                lin.bias.data = bias[i * self.embed_dim : (i + 1) * self.embed_dim]
            self._packed_bias = bias
        self._packed_ptrs = [t.data_ptr() for t in self._qkv_tensors()]  # where they must stay

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
        """The fused ``(3E, E)`` weight and ``(3E,)`` bias of the q, k, v projections.

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
        inputs = self._inputs(x, key_value, positions, spec, key_padding_mask)
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
    ) -> AttentionInputs:
        """This module's position schemes for one :meth:`forward` call, as data."""
        rotation = self._rotation(x, key_value, positions, packed=spec.layout == "packed",
                                  key_padding_mask=key_padding_mask)  # fmt: skip
        if self.window is not None and key_value is not None:
            raise ValueError(
                "a local window is for self-attention: key_value= cannot be given to a module "
                "built with window=."
            )
        if rotation is None and self.window is None:
            return NO_INPUTS
        return AttentionInputs(rotation=rotation, window=self.window)

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
        """Q, K, V split into heads, each ``(B, H, L, D)``; one GEMM for self-attention."""
        b, lq, _ = x.shape
        h, d, e = self.num_heads, self.head_dim, self.embed_dim
        weight, bias = self.qkv_weight()
        if key_value is None:
            qkv = _prepack.linear(x, weight, bias)  # (B, L, 3E)
            qkv = qkv.view(b, lq, 3, h, d).permute(2, 0, 3, 1, 4)  # (3, B, H, L, D)
            return tuple(qkv.unbind(0))
        lk = key_value.size(1)
        q = F.linear(x, weight[:e], None if bias is None else bias[:e])  # (B, Lq, E)
        q = q.view(b, lq, h, d).transpose(1, 2)  # (B, H, Lq, D)
        kv = F.linear(key_value, weight[e:], None if bias is None else bias[e:])  # (B, Lk, 2E)
        kv = kv.view(b, lk, 2, h, d).permute(2, 0, 3, 1, 4)  # (2, B, H, Lk, D)
        return (q, *kv.unbind(0))

    def attend(
        self,
        x: Tensor,
        prepared: PreparedMask | WindowedMask,
        *,
        key_value: Tensor | None = None,
        need_weights: bool = False,
        backend: str | None = None,
        rotation: Rotation | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The core of :meth:`forward` for callers that prepared the mask once (an encoder).

        ``x`` is ``(B, Lq, E)`` and already checked; ``prepared`` comes from
        :func:`bertattn.attention.masks.prepare_mask`. ``backend`` overrides ``self.backend``.
        A packed backend cannot run here (it needs :meth:`attend_packed`). ``rotation``: the
        rotary tables for the queries and keys (:mod:`.rotary`; computed once per forward by
        the caller). A local window comes as ``prepared``, a
        :class:`~bertattn.attention.window.WindowedMask`: ``sdpa`` skips the keys out of reach
        on a sequence long enough for it to pay (exploited), ``math`` and the other backends
        add the band to the mask (masked); ``explain()`` says which.
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
            inputs=NO_INPUTS if rotation is None else AttentionInputs(rotation=rotation),
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
        prepared, window, exploit = _window_plan(prepared, name, need_weights, key_value, x)
        if window is not None:
            inputs = replace(inputs, window=window)
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
        q, k, v = self.project_qkv(x, key_value)
        rec = None if compiling or not _steps._open_blocks else steps_recorder()
        q, k = _positioned(q, k, inputs, rec)
        reason = _describe(reason, inputs)
        if window is not None:
            reason = f"{reason}; window {window}: {_WINDOW_HOW[exploit]}"
        if dropout_p is None:
            dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        out_linear = _fast.submodule(self, "out_linear")
        if rec is not None:  # attention.steps: the input and projection of the next record
            rec.note_module(x, out_linear.weight, out_linear.bias)
        if exploit:
            context = local_attention(
                q, k, v, inputs.window, dropout_p=dropout_p, key_bias=prepared.bias
            )  # (B, H, Lq, D); a query with no key in reach: zeros
            weights = None
        else:
            context, weights = spec.fn(
                q, k, v, prepared.bias, dropout_p=dropout_p, need_weights=need_weights
            )  # (B, H, Lq, D), (B, H, Lq, Lk) | None
        live = prepared.live_rows
        if live is not None:  # rows with no key at all: zero weights, zero context
            context = context.masked_fill(~live, 0.0)
            weights = None if weights is None else weights.masked_fill(~live, 0.0)
        output = self._merge_out(context, out_linear, compiling)
        self._record(requested, name, reason, q, compiling)
        return output, weights

    def _merge_out(self, context: Tensor, out_linear: nn.Module, compiling: bool) -> Tensor:
        """Merge the heads ``(B, H, Lq, D)`` -> ``(B, Lq, H * D)`` and project them out."""
        b, h, lq, d = context.shape
        context = context.transpose(1, 2).reshape(b, lq, h * d)  # merge heads: (B, Lq, E)
        if type(out_linear) is nn.Linear and _fast.plain_call(out_linear, compiling):
            # exactly what the module call runs, without its per-call overhead
            params = out_linear._parameters
            return _prepack.linear(context, params["weight"], params["bias"])
        return self.out_linear(context)  # (B, Lq, E)

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
    ) -> Tensor:
        """Self-attention over packed real tokens: ``x`` ``(T, E)`` -> ``(T, E)``.

        ``packed`` comes from :func:`bertattn.attention.padding.pack_padding_mask`; each
        sequence attends only to its own tokens. ``bias``: an additive bias per sequence, one
        ``(1, H, l, l)`` block each (None for an empty sequence), added to its scaled scores
        (MPNet's relative position bias); only a backend registered with ``packed_bias=True``
        takes one (``varlen``). ``rotation``: ``(T, 1, D)`` rotary tables, positions restarting
        at 0 in every sequence (:func:`bertattn.attention.rotary.rotation_for_packed`);
        ``window``: local attention within each sequence (never across two), only on a backend
        registered with ``packed_window=True``.
        """
        inputs = AttentionInputs(rotation=rotation, window=window, bias=bias)
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
        check_inputs(spec, inputs)
        t = x.size(0)
        h, d = self.num_heads, self.head_dim
        weight, qkv_bias = self.qkv_weight()
        qkv = _prepack.linear(x, weight, qkv_bias).view(t, 3, h, d)  # (T, 3, H, D)
        q, k, v = qkv.unbind(1)  # (T, H, D) each
        q, k = _positioned(q, k, inputs, None)
        reason = _describe(reason, inputs)
        dropout_p = _fast.submodule(self, "dropout").p if self.training else 0.0
        context = spec.fn(q, k, v, packed, dropout_p=dropout_p, **inputs.packed_kwargs())
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
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"dropout={self.dropout.p}, backend={self.backend!r}"
        )
