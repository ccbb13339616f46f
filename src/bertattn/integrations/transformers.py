"""``attn_implementation="bertattn"`` for Hugging Face transformers.

Importing this module registers, under the name ``"bertattn"``, two functions together:

* the attention function (transformers' ``AttentionInterface``): bertattn's backends on the
  ``(B, H, L, D)`` query / key / value a transformers attention layer passes, the ``math``
  backend when attention weights are asked for (``output_attentions=True``), else the fused
  ``sdpa`` one; every call is recorded like bertattn's own (:func:`bertattn.explain`);
* the mask function (``AttentionMaskInterface``) that builds the mask it reads: transformers'
  boolean ``(B, 1, Lq, Lk)`` mask (True = attend), always materialized for causal masks too.

Both are needed. transformers builds no mask at all for an ``attn_implementation`` without a
mask function: a padded batch reaches the attention function with ``attention_mask=None`` and
padding is attended to silently (on all-MiniLM-L6-v2: a max error of 0.93). So :func:`register`
registers the pair, and the attention function refuses to run under a name that has no mask
function, and refuses any mask format it cannot read unambiguously, with a message.

Use::

    import bertattn.integrations.transformers  # registers "bertattn"
    model = transformers.BertModel.from_pretrained(path, attn_implementation="bertattn")
    with bertattn.explain() as log:
        model(**batch)
    print(log)  # one line per layer: the backend that ran, and why

``register("bertattn_math", backend="math")`` registers another name bound to one backend.

It runs under ``torch.no_grad``, ``torch.inference_mode`` and CPU / CUDA autocast as transformers'
own ``sdpa`` does, and traces without a graph break (``torch.compile(model, fullgraph=True)``):
traced, it keeps no Python-side state (no mask cache, no :func:`bertattn.explain` record).

A model whose attention does not go through ``AttentionInterface`` (MPNet computes it inline)
accepts the name in transformers and never runs bertattn: asking it of such a model warns,
once per model class, naming why.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

try:
    from transformers.masking_utils import (
        ALL_MASK_ATTENTION_FUNCTIONS,
        AttentionMaskInterface,
        causal_mask_function,
        sdpa_mask,
    )
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface
except ImportError as exc:  # no transformers, or one without AttentionMaskInterface
    raise ImportError(
        f"bertattn.integrations.transformers needs Hugging Face transformers with "
        f"AttentionInterface and AttentionMaskInterface (tested with 5.x): {exc}"
    ) from exc

from ..attention.backends import get_backend
from ..attention.dispatch import Dispatch, choose_backend, record
from ..attention.masks import LastMask, PreparedMask, prepare_mask

__all__ = [
    "NAME",
    "attention_forward",
    "make_attention_forward",
    "mask_forward",
    "register",
]

#: the ``attn_implementation`` name registered on import
NAME = "bertattn"

#: keyword arguments some attention layers pass that change the math; bertattn does not
#: implement them, so it refuses them rather than ignore them
_UNSUPPORTED = ("softcap", "s_aux", "sinks")


def mask_forward(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> Tensor | None:
    """The mask function registered with the attention function: transformers' ``sdpa_mask``
    (a boolean ``(B, 1, Lq, Lk)`` mask, True = attend, or None when nothing is masked), except
    that a causal mask is always materialized (``sdpa_mask`` may return None for one and rely
    on SDPA's ``is_causal`` flag, a flag bertattn's backends do not have)."""
    del allow_is_causal_skip  # always False, see above
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        use_vmap=use_vmap,
        device=device,
        **kwargs,
    )


def _shape(t: Any) -> str:
    shape = getattr(t, "shape", None)
    return "?" if shape is None else "(" + ", ".join(str(s) for s in shape) + ")"


def _implementation(module: nn.Module) -> str | None:
    config = getattr(module, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    return impl if isinstance(impl, str) else None


def _check_mask_function(module: nn.Module) -> None:
    """The trap: an implementation name with no mask function gets ``attention_mask=None``
    from transformers even for a padded batch. Refuse to run under such a name."""
    impl = _implementation(module)
    if impl is None:  # a layer called on its own: whoever calls it passes the mask
        return
    registry = ALL_MASK_ATTENTION_FUNCTIONS
    # transformers itself looks at _global_mapping (masking_utils._preprocess_mask_arguments)
    if impl in registry._global_mapping or impl in registry._local_mapping:
        return
    raise ValueError(
        f"attn_implementation {impl!r} runs bertattn's attention function but has no mask "
        f"function in transformers' AttentionMaskInterface: transformers then passes "
        f"attention_mask=None even for a padded batch, and padding would be attended to "
        f"silently. Register both with bertattn.integrations.transformers.register({impl!r}) "
        f'(importing the module registers "bertattn"), not AttentionInterface.register alone.'
    )


def _read_mask(
    attention_mask: Any, position_bias: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """``(keep, additive)`` from what transformers passed: a boolean 4-D mask (True = attend,
    ``sdpa_mask``'s and this module's mask function's form), or a floating 4-D additive mask
    (``eager_mask``'s form, or a custom 4-D mask given to the model); anything else is
    refused, since guessing its meaning could silently attend to padding."""
    if attention_mask is None:
        return None, position_bias
    if not isinstance(attention_mask, Tensor):
        raise ValueError(
            f"bertattn's attention function got an attention_mask of type "
            f"{type(attention_mask).__name__}; it reads a torch.Tensor of shape (batch, 1, "
            f"query_len, key_len): bool (True = attend) or float (added to the scores). A "
            f"flex-attention BlockMask means the mask function registered for this "
            f"attn_implementation is not bertattn's: use "
            f"bertattn.integrations.transformers.register(name)."
        )
    if attention_mask.dim() != 4:
        raise ValueError(
            f"bertattn's attention function got a {attention_mask.dim()}-D attention_mask of "
            f"shape {_shape(attention_mask)}; it reads only a 4-D (batch, 1|heads, query_len, "
            f"key_len) mask, bool (True = attend) or float (added to the scores). A 2-D "
            f"(batch, key_len) padding mask here means no matching mask function prepared it "
            f"(flash-attention's mask function passes one on): register the pair with "
            f"bertattn.integrations.transformers.register(name)."
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask, position_bias
    if attention_mask.is_floating_point():
        additive = attention_mask if position_bias is None else attention_mask + position_bias
        return None, additive
    raise ValueError(
        f"bertattn's attention function got a 4-D attention_mask of dtype "
        f"{attention_mask.dtype}; an integer mask is ambiguous (1 = attend, or 1 added to the "
        f"scores?). Pass a bool mask (True = attend) or a float additive one (0 = attend, "
        f"-inf or a large negative number = masked)."
    )


def _causal_keep(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """SDPA's ``is_causal=True``: query i sees keys 0..i (top-left aligned)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril()


def _repeat_kv(t: Tensor, n_rep: int) -> Tensor:
    """``(B, Hkv, L, D)`` -> ``(B, Hkv * n_rep, L, D)``: grouped-query attention."""
    if n_rep == 1:
        return t
    b, h, length, d = t.shape
    return t[:, :, None].expand(b, h, n_rep, length, d).reshape(b, h * n_rep, length, d)


#: one prepared mask: transformers passes the same mask tensor to every layer of a forward, so
#: it is turned into bertattn's additive bias once, not once per layer. The entry is dropped
#: when that tensor is freed, and not reused if it was modified in place (its version changed).
_cached = LastMask()


def _tracing() -> bool:
    """Under torch.compile / torch.export / torch.jit tracing: no Python-side state (a cache
    would become a guard or a graph break), no explain() records, no data-dependent branch."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def _cache_source(keep: Tensor | None, additive: Tensor | None) -> Tensor | None:
    """The mask tensor a prepared mask may be cached under, or None when it must not be
    cached: two mask tensors (no single key), a traced call, a tensor that needs grad, or an
    inference tensor (``torch.inference_mode``: it has no version counter, so an in-place
    edit could not be seen; reading ``_version`` raises)."""
    source = keep if additive is None else (additive if keep is None else None)
    if source is None or _tracing():
        return None
    if source.requires_grad or source.is_inference():
        return None
    return source


def _prepare(
    keep: Tensor | None,
    additive: Tensor | None,
    target: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> PreparedMask:
    """:func:`bertattn.attention.masks.prepare_mask` of the mask, cached per mask tensor."""
    b, h, q_len, k_len = target
    source = _cache_source(keep, additive)
    if source is not None:
        # a mask prepared under inference_mode is an inference tensor: not for autograd later
        key = (target, dtype, device, torch.is_inference_mode_enabled())
        last = _cached.get(source, key)
        if last is not None:
            return last
    prepared = prepare_mask(
        keep,
        None,
        additive,
        batch=b,
        heads=h,
        query_len=q_len,
        key_len=k_len,
        dtype=dtype,
        device=device,
    )
    if source is not None:
        _cached.put(source, key, prepared)
    return prepared


def _check_supported(kwargs: dict[str, Any]) -> None:
    """Refuse the interface's arguments bertattn's attention does not implement."""
    for arg in _UNSUPPORTED:
        if kwargs.get(arg) is not None:
            raise ValueError(
                f"bertattn's attention function does not implement {arg!r}; use "
                f'attn_implementation="eager" for this model.'
            )


def _record(module: nn.Module, choice: tuple[str, str, str], name: str, query: Tensor) -> None:
    """Record ``choice`` (the backend asked for, the one chosen, why) on ``module`` (as
    bertattn's MultiHeadAttention keeps its own) and in the dispatch log, naming the model's
    ``attn_implementation`` (``name`` when it has none)."""
    requested, chosen, reason = choice
    impl = _implementation(module) or name
    decision = Dispatch(
        requested,
        chosen,
        f"{reason} (transformers attn_implementation={impl!r})",
        tuple(query.shape),
        str(query.dtype).replace("torch.", ""),
    )
    module.last_dispatch = decision
    record(decision)


def make_attention_forward(backend: str = "auto", *, name: str = NAME) -> Callable[..., Any]:
    """An attention function for transformers' ``AttentionInterface`` that runs bertattn's
    ``backend`` (``"auto"``: ``math`` when weights are asked for, else ``sdpa``; or a padded
    backend by name). Register it with :func:`register`, which adds its mask function too."""
    if backend != "auto":
        spec = get_backend(backend)  # raises with the valid names
        if spec.layout != "padded":
            raise ValueError(
                f"backend {backend!r} works on packed tokens and cannot read transformers' "
                f"(batch, 1, query_len, key_len) mask; use 'auto', 'sdpa' or 'math'."
            )

    def forward(
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        position_bias: Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """transformers' attention interface: ``query`` ``(B, H, Lq, D)``, ``key`` / ``value``
        ``(B, Hkv, Lk, D)`` -> ``(attn_output (B, Lq, H, D), attn_weights (B, H, Lq, Lk) or
        None)``."""
        _check_supported(kwargs)
        _check_mask_function(module)
        keep, additive = _read_mask(attention_mask, position_bias)
        n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
        key, value = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
        b, h, q_len, d = query.shape
        k_len = key.size(2)
        # no mask: SDPA's rule for is_causal (the argument, else the module's flag, else True)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if attention_mask is None and causal and q_len > 1:
            keep = _causal_keep(q_len, k_len, query.device)
        if scaling is not None and not math.isclose(scaling, d**-0.5, rel_tol=1e-9):
            query = query * (scaling * math.sqrt(d))  # the backends divide by sqrt(d)

        need_weights = bool(kwargs.get("output_attentions", False))
        chosen, reason = choose_backend(
            backend,
            need_weights=need_weights,
            device_type=query.device.type,
            dtype=query.dtype,
            key_len=k_len,
            training=float(dropout) > 0.0,
        )
        spec = get_backend(chosen)
        if need_weights and not spec.returns_weights:
            raise ValueError(
                f"output_attentions=True, but attn_implementation {name!r} runs backend "
                f"{chosen!r}, which returns no attention weights; use "
                f'attn_implementation="{NAME}" (math for weights) or register(..., '
                f'backend="math").'
            )
        prepared = _prepare(keep, additive, (b, h, q_len, k_len), query.dtype, query.device)
        context, weights = spec.fn(
            query, key, value, prepared.bias, dropout_p=float(dropout), need_weights=need_weights
        )  # (B, H, Lq, D), (B, H, Lq, Lk) | None
        live = prepared.live_rows
        if live is not None:  # a query row with no key at all: zero weights, zero context
            context = context.masked_fill(~live, 0.0)
            weights = None if weights is None else weights.masked_fill(~live, 0.0)
        if not _tracing():  # traced: no Python-side record inside the graph
            _record(module, (backend, chosen, reason), name, query)
        return context.transpose(1, 2).contiguous(), weights  # (B, Lq, H, D)

    forward.__name__ = forward.__qualname__ = f"bertattn_attention_forward_{backend}"
    return forward


#: ``(name, backend)`` -> the function registered for it, so that registering again registers
#: the same function object
_FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {}


def register(name: str = NAME, *, backend: str = "auto") -> str:
    """Register bertattn under ``attn_implementation=name``: the attention function running
    ``backend`` AND its mask function, together (never one without the other). Registering the
    same name again replaces both; returns ``name``."""
    if not isinstance(name, str) or not name or name == "eager":
        raise ValueError(f"name must be a non-empty string other than 'eager', got {name!r}.")
    fn = _FUNCTIONS.get((name, backend))
    if fn is None:
        fn = _FUNCTIONS[(name, backend)] = make_attention_forward(backend, name=name)
    AttentionMaskInterface.register(name, mask_forward)
    AttentionInterface.register(name, fn)
    return name


#: model classes already warned about (:func:`_warn_inline_attention`): once each
_WARNED: set[str] = set()


def _warn_inline_attention(model: Any, implementation: str) -> None:
    """Warn, once per model class, when a bertattn name is asked of a model whose attention
    never goes through transformers' ``AttentionInterface`` (MPNet computes its attention
    inline: ``_supports_attention_backend`` is False), so bertattn's function would never
    run and nothing else would say so."""
    cls = type(model)
    if implementation not in {n for n, _ in _FUNCTIONS} or cls.is_backend_compatible():
        return
    if cls.__name__ in _WARNED:
        return
    _WARNED.add(cls.__name__)
    warnings.warn(
        f"attn_implementation={implementation!r} on {cls.__name__} never runs bertattn: "
        f"{cls.__name__} computes its attention inline, not through transformers' "
        f"AttentionInterface (its _supports_attention_backend is False), so transformers "
        f"accepts the name and runs its own attention. To run this model on bertattn's "
        f"attention, load it with bertattn.Bert.load(folder) (MPNet is one of its families).",
        UserWarning,
        stacklevel=4,
    )


def _watch_models() -> None:
    """Wrap ``PreTrainedModel.get_correct_attn_implementation`` (once) so that asking a
    bertattn name of a model that cannot use it warns (:func:`_warn_inline_attention`)."""
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel.get_correct_attn_implementation
    if getattr(original, "_bertattn_watch", False):
        return

    def get_correct_attn_implementation(
        self: Any, requested_attention: str | None, *args: Any, **kwargs: Any
    ) -> str:
        chosen = original(self, requested_attention, *args, **kwargs)
        if isinstance(chosen, str):
            _warn_inline_attention(self, chosen)
        return chosen

    get_correct_attn_implementation._bertattn_watch = True  # type: ignore[attr-defined]
    get_correct_attn_implementation.__doc__ = original.__doc__
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation  # type: ignore[method-assign]


register()
_watch_models()

#: the attention function registered as ``"bertattn"``
attention_forward = ALL_ATTENTION_FUNCTIONS[NAME]
