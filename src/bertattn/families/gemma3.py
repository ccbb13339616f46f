"""Gemma 3 as an encoder (``model_type: gemma3_text`` with ``use_bidirectional_attention``:
EmbeddingGemma), read top to bottom: config, embeddings, layer, encoder, names, record.

What it changes against BERT, in the attention and around it:

* grouped-query heads: ``num_key_value_heads`` key/value heads (EmbeddingGemma-300m: 1 for 3
  query heads), of ``head_dim`` each (not ``hidden_size / num_attention_heads``);
* the scores scaled by ``query_pre_attn_scalar ** -0.5`` (not ``1 / sqrt(head_dim)``);
* q/k norms: Gemma's RMSNorm (``(1 + weight)``) over the head size on every query and key
  head, before the rotation;
* rotary positions, two bases: ``sliding_attention`` layers rotate with the local base
  (``rope_local_base_freq``, 10,000), ``full_attention`` layers with the global one
  (``rope_theta``, 1,000,000); ``layer_types`` (or ``sliding_window_pattern``) says which;
* bidirectional attention, and on the sliding layers a window of both sides: query ``i``
  sees key ``j`` when ``|i - j| <= sliding_window // 2`` (transformers turns the config's
  ``sliding_window`` S into the exclusive radius ``S // 2 + 1``);
* word embeddings multiplied by ``sqrt(hidden_size)`` (rounded to the table's dtype), no
  position table, no token types;
* sandwich blocks: four Gemma RMSNorms a layer (before and after the attention, before and
  after the feed-forward), a final norm; a gated feed-forward
  (``down(gelu_tanh(gate(x)) * up(x))``); no bias but the four attention projections' when
  ``attention_bias``; no pooler.

A causal Gemma (``use_bidirectional_attention`` false or absent) and the attention's logit
soft-capping (``attn_logit_softcapping``) are refused by name; ``final_logit_softcapping``
acts on a language model's logits only, which the encoder does not compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from ..blocks import (
    GatedFeedForward,
    LayerKind,
    OffsetRMSNorm,
    RotaryEncoder,
    SandwichBlock,
    ScaledTokenEmbeddings,
)
from ..errors import ModelFolderError
from . import qwen3
from .config_fields import decoder_sizes, known_activation, kv_heads, positive, refuse
from .registry import register
from .rope import rope_object, rope_theta
from .rotary_bert import Variant

__all__ = ["Gemma3Arch", "read_config"]


# ---------------------------------------------------------------------- config
#: the checkpoint's names as :func:`.rotary_bert.rename` reads them: Qwen3's
#: (:data:`.qwen3.NAMES`: ``mlp.gate_proj`` and ``mlp.up_proj`` joined into one ``(2I, E)``
#: ``mlp.gate_up``, the activated gate first); ``model.`` in a task checkpoint
#: (``Gemma3ForCausalLM``), none in ``Gemma3TextModel``'s
NAMES = replace(qwen3.NAMES, name="gemma3_text", title="Gemma 3",
                default_act="gelu_pytorch_tanh")  # fmt: skip
TITLE = NAMES.title
#: the two layer types of ``layer_types``, and the rotary base each has by default
LAYER_TYPES = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
#: the older configs' field for each layer type's base (transformers 5 writes rope_parameters)
_LEGACY_THETA = {"sliding_attention": "rope_local_base_freq", "full_attention": "rope_theta"}
#: the sizes where the config has none (:func:`.config_fields.decoder_sizes`)
DEFAULTS = {
    "vocab_size": 262_208,
    "intermediate_size": 9216,
    "max_position_embeddings": 131_072,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class Gemma3Arch:
    """Gemma 3's settings beyond BERT's sizes: the heads, the scale, the norms' epsilon and,
    one per layer, its :class:`~bertattn.blocks.LayerKind` (rotary base and window)."""

    kv_heads: int
    head_dim: int
    scale: float
    norm_eps: float
    attention_bias: bool
    kinds: tuple[LayerKind, ...]
    #: the names :func:`.rotary_bert.rename` reads
    variant: Variant = NAMES


def _refuse(source: str, field: str, value: object, expected: str) -> ModelFolderError:
    return refuse(source, TITLE, field, value, expected)


def _positive(data: dict[str, Any], field: str, default: int, source: str) -> int:
    return positive(data, field, default, source, TITLE)


def _check_supported(data: dict[str, Any], source: str) -> None:
    """Refuse, by the field, what the encoder does not compute."""
    if data.get("use_bidirectional_attention") is not True:
        raise _refuse(source, "use_bidirectional_attention",
                      data.get("use_bidirectional_attention"),
                      "use_bidirectional_attention true (an embedder, e.g. EmbeddingGemma; a "
                      "causal Gemma is a language model)")  # fmt: skip
    if data.get("attn_logit_softcapping") is not None:
        raise _refuse(source, "attn_logit_softcapping", data["attn_logit_softcapping"],
                      "attn_logit_softcapping null")  # fmt: skip
    if data.get("rope_scaling") is not None:
        raise _refuse(source, "rope_scaling", data["rope_scaling"], "rope_scaling null")


def _layer_types(data: dict[str, Any], layers: int, source: str) -> list[str]:
    """``layer_types``, or every ``sliding_window_pattern``-th layer full (as transformers)."""
    types = data.get("layer_types")
    if types is None:
        pattern = _positive(data, "sliding_window_pattern", 6, source)
        return [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    if not isinstance(types, list) or len(types) != layers or set(types) - set(LAYER_TYPES):
        raise _refuse(source, "layer_types", types,
                      f"a list of {layers} (num_hidden_layers) entries, each "
                      f"{' or '.join(map(repr, LAYER_TYPES))}")  # fmt: skip
    return types


def _thetas(data: dict[str, Any], source: str) -> dict[str, float]:
    """Each layer type's rotary base: ``rope_parameters[type].rope_theta`` (transformers 5),
    else ``rope_local_base_freq`` / ``rope_theta`` (older configs), else Gemma's defaults."""

    def fail(field: str, value: object, expected: str) -> ModelFolderError:
        return _refuse(source, field, value, expected)

    params = rope_object(data.get("rope_parameters"), "rope_parameters", fail,
                         "a dict of sliding_attention and full_attention")  # fmt: skip
    thetas = {}
    for kind, default in LAYER_TYPES.items():
        field = f"rope_parameters.{kind}"
        one = rope_object(params.get(kind), field, fail, "a dict with rope_type and rope_theta")
        if one.get("rope_type", "default") != "default":
            raise fail(f"{field}.rope_type", one["rope_type"], "'default'")
        legacy = _LEGACY_THETA[kind]
        if "rope_theta" in one:
            thetas[kind] = rope_theta(one["rope_theta"], f"{field}.rope_theta", fail)
        else:
            thetas[kind] = rope_theta(data.get(legacy, default), legacy, fail)
    return thetas


def _scale(data: dict[str, Any], source: str) -> float:
    """``query_pre_attn_scalar ** -0.5``, the scores' factor."""
    scalar = data.get("query_pre_attn_scalar", 256)
    if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0:
        raise _refuse(source, "query_pre_attn_scalar", scalar, "a number > 0")
    return float(scalar) ** -0.5


def _arch(data: dict[str, Any], layers: int, heads: int, source: str) -> Gemma3Arch:
    kv = kv_heads(data, heads, 4, source, TITLE)
    radius = _positive(data, "sliding_window", 4096, source) // 2
    thetas = _thetas(data, source)
    kinds = tuple(
        LayerKind(thetas[t], radius if t == "sliding_attention" else None)
        for t in _layer_types(data, layers, source)
    )
    return Gemma3Arch(
        kv_heads=kv,
        head_dim=_positive(data, "head_dim", 256, source),
        scale=_scale(data, source),
        norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        attention_bias=bool(data.get("attention_bias", False)),
        kinds=kinds,
    )


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], Gemma3Arch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`Gemma3Arch`."""
    _check_supported(data, source)
    layers = _positive(data, "num_hidden_layers", 26, source)
    heads = _positive(data, "num_attention_heads", 8, source)
    act = known_activation(data, "hidden_activation", "gelu_pytorch_tanh", source)
    arch = _arch(data, layers, heads, source)
    hidden = _positive(data, "hidden_size", 2304, source)
    return decoder_sizes(data, (hidden, layers, heads), act, arch.norm_eps, DEFAULTS), arch


# ---------------------------------------------------------------------- embeddings
def embeddings(config: Any) -> ScaledTokenEmbeddings:
    """Word embeddings times ``sqrt(hidden_size)``: no positions, no token types, no norm."""
    e = config.hidden_size
    return ScaledTokenEmbeddings(config.vocab_size, e, math.sqrt(e),
                                 padding_idx=config.pad_token_id)  # fmt: skip


# ---------------------------------------------------------------------- layer
def _layer(config: Any, kind: LayerKind, backend: str) -> SandwichBlock:
    """One layer: Gemma RMSNorm, bidirectional grouped-query attention with q/k norms, the
    layer kind's rotation and window and Gemma's scale, Gemma RMSNorm (the sandwich), then
    the same around the gated GELU feed-forward."""
    arch: Gemma3Arch = config.arch
    e = config.hidden_size
    attn = qwen3.grouped_attention(config, backend, kind.theta, window=kind.window,
                                   scale=arch.scale, qk_norm=True)  # fmt: skip
    attn.q_norm = OffsetRMSNorm(arch.head_dim, arch.norm_eps)  # Gemma's (1 + weight)
    attn.k_norm = OffsetRMSNorm(arch.head_dim, arch.norm_eps)
    mlp = GatedFeedForward(e, config.intermediate_size, config.hidden_act)
    norms = tuple(OffsetRMSNorm(e, arch.norm_eps) for _ in range(4))
    return SandwichBlock(attn, mlp, norms)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- encoder
def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, None]:
    """Gemma 3's embeddings and encoder (its layers, then the final norm); no pooler."""
    arch: Gemma3Arch = config.arch
    kinds = list(arch.kinds)
    layers = [_layer(config, kind, backend) for kind in kinds]
    final = OffsetRMSNorm(config.hidden_size, arch.norm_eps)
    return embeddings(config), RotaryEncoder(layers, kinds, final), None  # type: ignore[arg-type]


# ---------------------------------------------------------------------- names
#: the sandwich's norms: the checkpoint's name -> bertattn's, in a layer
_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "post_mlp_norm",
}


def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """Gemma 3's names (after :func:`.rotary_bert.rename`, without ``model.``) -> bertattn's:
    Qwen3's attention and feed-forward names, four norms a layer."""
    keys = {
        k: v
        for k, v in qwen3.key_map(config).items()
        if not k.endswith(("input_layernorm.weight", "post_attention_layernorm.weight"))
    }
    for i in range(config.num_hidden_layers):
        for theirs, ours in _NORMS.items():
            keys[f"layers.{i}.{theirs}.weight"] = f"encoder.layers.{i}.{ours}.weight"
    return keys


register(
    qwen3.decoder_family(
        "gemma3_text",
        "Gemma 3",
        read_config,
        key_map,
        build,
        steps="Gemma 3's grouped-query heads, q/k norms, window and rotary positions",
        missing={"int8": "Gemma 3's sandwich-norm layers"},
    )
)
