"""Cheap access to submodules and their parameters on the per-call hot path.

``nn.Module.__getattr__`` (``self.out_linear``, ``lin.weight``) costs about a microsecond per
lookup in torch 2.13, and calling a module (``lin(x)``) a few more: at BERT's small shapes
(one short query) that is a large share of a call. These helpers read ``_modules`` /
``_parameters`` directly and call ``F.linear`` itself when calling the module would do
exactly that: a plain ``nn.Linear`` (not a subclass) with no hook of any kind, outside
``torch.jit`` tracing and ``torch.compile`` (which keep the module call, for scope names and
guards). Anything else goes the ordinary way, so behaviour is unchanged.

:func:`self_attention` is :class:`~bertattn.attention.MultiHeadAttention`'s whole call for its
commonest case (self-attention in inference, no weights, at most a key padding mask, ``auto``
choosing fused SDPA): the same ops on the same tensors as the general path, in the same order,
without the steps that case does not need (the memo of checked cases, the rotary and window
branches, a dozen arguments handed down two calls). At one module call of B=1, L=16, E=64 the
general path's Python is about as long as its kernels. :data:`FAST_CALL` turns it off.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _nn_module

from . import backends as _backends
from . import dispatch as _dispatch
from . import prepack as _prepack
from . import steps as _steps
from .masks import self_attention_mask

__all__ = [
    "FAST_CALL",
    "self_attention",
    "submodule",
    "param",
    "hook_free",
    "plain_context",
    "all_stock",
    "plain_call",
    "call",
    "linear",
    "layer_norm",
    "dropout",
]

_MISSING = object()

#: :func:`self_attention` may answer a module call (False: every call takes the general path;
#: tests and benchmarks compare the two)
FAST_CALL = True


def submodule(owner: nn.Module, name: str) -> nn.Module:
    """``owner.<name>`` for a registered submodule, without ``__getattr__``."""
    mod = owner._modules.get(name, _MISSING)
    return getattr(owner, name) if mod is _MISSING else mod  # type: ignore[return-value]


def param(mod: nn.Module, name: str) -> Tensor | None:
    """``mod.<name>`` for a registered parameter (None when registered as None)."""
    value = mod._parameters.get(name, _MISSING)
    return getattr(mod, name) if value is _MISSING else value


def hook_free(mod: nn.Module) -> bool:
    """No hook of any kind on ``mod`` itself and no compiled call (``module.compile()``)."""
    return not (
        mod._forward_hooks
        or mod._forward_pre_hooks
        or mod._backward_hooks
        or mod._backward_pre_hooks
        or mod._compiled_call_impl is not None
    )


def plain_context() -> bool:
    """No global module hook, no ``torch.jit`` tracing and no ``torch.compile``: whether a
    module call does what its forward does is then up to the module alone."""
    return not (
        _nn_module._global_forward_hooks
        or _nn_module._global_forward_pre_hooks
        or _nn_module._global_backward_hooks
        or _nn_module._global_backward_pre_hooks
        or torch._C._get_tracing_state()
        or torch.compiler.is_compiling()
    )


def all_stock(pairs: Iterable[tuple[nn.Module, type]]) -> bool:
    """Every ``(module, class)`` pair is stock: the module is exactly that class (not a
    subclass), in eval mode and :func:`hook_free`. One loop for the checks made per forward
    over many modules; it reads each module's ``__dict__`` (the type is checked first, so no
    property of a subclass can stand in): a third faster than attribute lookups."""
    for mod, cls in pairs:
        if type(mod) is not cls:
            return False
        d = mod.__dict__
        try:
            if (
                d["training"]
                or d["_forward_hooks"]
                or d["_forward_pre_hooks"]
                or d["_backward_hooks"]
                or d["_backward_pre_hooks"]
                or d.get("_compiled_call_impl") is not None  # set by module.compile()
            ):
                return False
        except KeyError:  # not made by nn.Module.__init__: the ordinary call path decides
            return False
    return True


def plain_call(mod: nn.Module, compiling: bool | None = None) -> bool:
    """Whether ``mod(x)`` would only run ``mod.forward(x)``: no hook, no tracing, no compile
    (``compiling=True``: the caller knows it is compiling, so no)."""
    if compiling:
        return False
    return hook_free(mod) and plain_context()


def call(mod: nn.Module, *args: object) -> object:
    """``mod(*args)``; ``mod.forward(*args)`` itself when that is all the call would run
    (:func:`plain_call`)."""
    if plain_call(mod):
        return mod.forward(*args)
    return mod(*args)


def linear(
    mod: nn.Module, x: Tensor, compiling: bool | None = None, checked: bool = False
) -> Tensor:
    """``mod(x)``; for a plain ``nn.Linear`` without hooks, ``F.linear`` directly (through
    the weight's MKL pack when it has one: :mod:`bertattn.attention.prepack`) (``checked``: the
    caller made sure of that already)."""
    if checked or (type(mod) is nn.Linear and plain_call(mod, compiling)):
        return _prepack.linear(x, mod._parameters["weight"], mod._parameters["bias"])
    return mod(x)


def layer_norm(mod: nn.Module, x: Tensor, checked: bool = False) -> Tensor:
    """``mod(x)``; for a plain ``nn.LayerNorm`` without hooks, ``F.layer_norm`` directly
    (``checked``: the caller made sure of that already)."""
    if checked or (type(mod) is nn.LayerNorm and plain_call(mod)):
        d = mod.__dict__
        # F.layer_norm's own body, without its Python wrapper (its last argument, cudnn_enable,
        # is a deprecated flag ATen ignores; reading torch.backends.cudnn.enabled costs ~0.5 us)
        return torch.layer_norm(
            x, d["normalized_shape"], mod._parameters["weight"], mod._parameters["bias"], d["eps"]
        )
    return mod(x)


def dropout(mod: nn.Module, x: Tensor) -> Tensor:
    """``mod(x)``; a plain ``nn.Dropout`` in eval mode returns ``x`` itself, as its forward
    would (``F.dropout(training=False)`` is the identity), without the call."""
    if type(mod) is nn.Dropout and not mod.training and 0.0 <= mod.p <= 1.0 and plain_call(mod):
        return x
    return mod(x)


def _plain_out_linear(mod: nn.Module, x: object) -> nn.Linear | None:
    """``mod``'s ``out_linear`` when the module and the call are of the handled kind (see
    :func:`self_attention`; the checks that need no shapes), else None."""
    d = mod.__dict__
    if (
        not FAST_CALL
        or d["training"]
        or d["rotary_theta"] is not None
        or not d.get("_article", True)  # grouped heads, causal, q/k norm, another scale
        or d["window"] is not None
        or torch.is_grad_enabled()
        or _steps._open_blocks
        or not isinstance(x, Tensor)
        or x.dim() != 3
    ):
        return None
    out_linear = d["_modules"].get("out_linear")
    if type(out_linear) is not nn.Linear or not hook_free(out_linear) or not plain_context():
        return None
    return out_linear


def self_attention(
    mod: nn.Module, x: Tensor, key_padding_mask: Tensor | None
) -> tuple[Tensor, None] | None:
    """``mod(x, key_padding_mask=key_padding_mask, need_weights=False)`` for a
    :class:`~bertattn.attention.MultiHeadAttention` ``mod``, computed as its general path
    computes it, or None where this case is not the one handled here (the caller then takes
    the general path, which also raises for wrong arguments).

    Handled: :data:`FAST_CALL` on; ``mod`` in eval mode, of the article's shape (no grouped
    heads, head size, scale, causal mask or q/k norm of its own), without rotary positions or a
    window,
    its q/k/v still in their fused storage; no autograd (``torch.no_grad`` or
    ``torch.inference_mode``), no steps recording, no tracing, compiling or global module hook;
    ``x`` a ``(B, L, E)`` tensor of the module's dtype, device and width; ``out_linear`` a plain
    ``nn.Linear`` without hooks; ``auto`` (or ``"sdpa"``) running the registered fused SDPA.
    The caller has checked that no ``mask``, ``key_value``, ``attn_bias`` or ``positions`` was
    given and that ``need_weights`` is False. ``x``: ``(B, L, E)``; returns ``((B, L, E),
    None)``."""
    out_linear = _plain_out_linear(mod, x)
    if out_linear is None:
        return None
    d = mod.__dict__
    params = out_linear._parameters
    w_out, b_out = params["weight"], params["bias"]
    b, length, e = x.shape
    if (
        e != d["embed_dim"]
        or x.dtype != w_out.dtype  # type: ignore[union-attr]
        or x.device != w_out.device  # type: ignore[union-attr]
        or x.numel() == 0
        or not mod._still_packed()  # type: ignore[operator]
    ):
        return None
    requested = d["backend"]
    name, reason = _dispatch.choose_backend(
        requested,
        need_weights=False,
        device_type=x.device.type,
        dtype=x.dtype,
        key_len=length,
        training=False,
    )
    spec = _backends.BACKENDS.get(name)
    if name != "sdpa" or spec is None or spec.fn is not _backends.sdpa_attention:
        return None
    h = d["num_heads"]
    if key_padding_mask is None:
        bias = live = None
    else:  # validated as the general path validates it (the same function)
        prepared = self_attention_mask(key_padding_mask, None, heads=h, like=x)
        bias, live = prepared.bias, prepared.live_rows
    qkv = _prepack.linear(x, d["_packed_weight"], d["_packed_bias"])  # (B, L, 3E)
    q, k, v = qkv.view(b, length, 3, h, e // h).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, D)
    context, _ = _backends.sdpa_attention(q, k, v, bias, dropout_p=0.0, need_weights=False)
    if live is not None:  # rows with no key at all: zero context
        context = context.masked_fill(~live, 0.0)
    context = context.transpose(1, 2).reshape(b, length, e)  # merge heads: (B, L, E)
    output = _prepack.linear(context, w_out, b_out)  # type: ignore[arg-type]
    mod._record(requested, name, reason, q, False)  # type: ignore[operator]
    return output, None
