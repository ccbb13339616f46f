"""EuroBERT (``model_type: eurobert``: EuroBERT-210m/610m/2.1B, the base of
jina-embeddings-v5-text-nano), read top to bottom: config, layer, encoder, names, record.

An encoder on a decoder's layer (Llama's). What it changes against BERT, in the attention and
around it:

* rotary positions (``rope_parameters.rope_theta``, or the hub folders' ``rope_theta``), no
  position table, no token types, no norm after the embeddings;
* grouped-query-capable heads: ``num_key_value_heads`` key/value heads (the released sizes
  have as many as query heads), each shared by ``num_attention_heads / num_key_value_heads``
  query heads, of ``head_dim`` each;
* bidirectional attention: every query sees every real key (no causal mask, no q/k norm);
* pre-norm blocks with RMSNorm (``x + attn(norm(x))``), a final norm; a SiLU-gated
  feed-forward (``down(act(gate(x)) * up(x))``), its three projections biased when
  ``mlp_bias``, the four attention projections when ``attention_bias``; no pooler.

The embeddings and the checkpoint's names are Qwen3's (:mod:`.qwen3`) without its q/k norms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from ..attention import MultiHeadAttention
from ..blocks import EncoderBlock, GatedFeedForward, LayerKind, RotaryEncoder, activation, make_norm
from ..errors import ModelFolderError
from . import qwen3
from .config_fields import positive, refuse, rope_theta
from .registry import Family, register
from .rotary_bert import Variant, rename

__all__ = ["EuroBertArch", "read_config"]


# ---------------------------------------------------------------------- config
#: the checkpoint's names: Qwen3's (:data:`.qwen3.NAMES`), with EuroBERT's rotation base
NAMES = replace(qwen3.NAMES, name="eurobert", title="EuroBERT", default_theta=10_000.0)


@dataclass(frozen=True)
class EuroBertArch(qwen3.Qwen3Arch):
    """EuroBERT's settings beyond BERT's sizes: Qwen3's (``causal`` always False), and biases
    on the feed-forward's three projections when ``mlp_bias``."""

    mlp_bias: bool = False
    variant: Variant = NAMES


def _positive(data: dict[str, Any], field: str, default: int, source: str) -> int:
    return positive(data, field, default, source, NAMES.title)


def _arch(data: dict[str, Any], hidden: int, heads: int, source: str) -> EuroBertArch:
    kv_heads = _positive(data, "num_key_value_heads", heads, source)
    if heads % kv_heads:
        raise refuse(source, NAMES.title, "num_key_value_heads", kv_heads,
                     f"a divisor of num_attention_heads ({heads})")  # fmt: skip
    return EuroBertArch(
        kv_heads=kv_heads,
        head_dim=_positive(data, "head_dim", hidden // heads, source),
        theta=rope_theta(data, NAMES.default_theta, source, NAMES.title),
        norm_eps=float(data.get("rms_norm_eps", 1e-5)),
        attention_bias=bool(data.get("attention_bias", False)),
        causal=False,
        mlp_bias=bool(data.get("mlp_bias", False)),
    )


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], EuroBertArch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`EuroBertArch`."""
    hidden = _positive(data, "hidden_size", 768, source)
    heads = _positive(data, "num_attention_heads", 12, source)
    act = data.get("hidden_act", "silu")
    try:
        activation(act)
    except ValueError as exc:
        raise ModelFolderError(f"{source}: {exc}") from None
    arch = _arch(data, hidden, heads, source)
    sizes = {
        "model_type": "bert",
        "vocab_size": data.get("vocab_size", 128256),
        "hidden_size": hidden,
        "num_hidden_layers": _positive(data, "num_hidden_layers", 12, source),
        "num_attention_heads": heads,
        "intermediate_size": data.get("intermediate_size", 3072),
        "hidden_act": act,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": data.get("attention_dropout", 0.0),
        "max_position_embeddings": data.get("max_position_embeddings", 8192),
        "type_vocab_size": 2,  # token type ids are read past: a pair's segments are not told apart
        "layer_norm_eps": arch.norm_eps,
        "pad_token_id": data.get("pad_token_id"),
    }
    return sizes, arch


# ---------------------------------------------------------------------- layer
def _layer(config: Any, backend: str) -> EncoderBlock:
    """One layer: RMSNorm, bidirectional grouped-query attention with rotation, RMSNorm, the
    SiLU-gated feed-forward."""
    arch: EuroBertArch = config.arch
    e = config.hidden_size
    attn = MultiHeadAttention(
        e,
        config.num_attention_heads,
        config.attention_probs_dropout_prob,
        bias=arch.attention_bias,
        backend=backend,
        rotary_theta=arch.theta,
        num_kv_heads=arch.kv_heads,
        head_dim=arch.head_dim,
    )
    mlp = GatedFeedForward(e, config.intermediate_size, config.hidden_act,
                           bias_in=arch.mlp_bias, bias_out=arch.mlp_bias)  # fmt: skip
    norms = [make_norm(e, arch.norm_eps, bias=False, kind="rms_norm") for _ in range(2)]
    return EncoderBlock(attn, mlp, *norms, prenorm=True)


# ---------------------------------------------------------------------- encoder
def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, None]:
    """EuroBERT's embeddings (words only, as Qwen3's) and encoder (its layers, then the final
    RMSNorm); no pooler."""
    arch: EuroBertArch = config.arch
    n = config.num_hidden_layers
    layers = [_layer(config, backend) for _ in range(n)]
    final = make_norm(config.hidden_size, arch.norm_eps, bias=False, kind="rms_norm")
    return qwen3.embeddings(config), RotaryEncoder(layers, [LayerKind(arch.theta)] * n, final), None


# ---------------------------------------------------------------------- names
def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """EuroBERT's names (after :func:`.rotary_bert.rename`, without ``model.``) -> bertattn's:
    Qwen3's without the q/k norms, with the feed-forward's biases when ``mlp_bias``."""
    arch: EuroBertArch = config.arch
    qk_norms = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
    keys = {k: v for k, v in qwen3.key_map(config).items() if not k.endswith(qk_norms)}
    if arch.mlp_bias:
        for i in range(config.num_hidden_layers):
            theirs, ours = f"layers.{i}.mlp.", f"encoder.layers.{i}.mlp."
            keys[f"{theirs}gate_up.bias"] = f"{ours}w_in.bias"
            keys[f"{theirs}down_proj.bias"] = f"{ours}w_out.bias"
    return keys


register(
    Family(
        "eurobert",
        "EuroBERT",
        read_config,
        rename,
        key_map,
        build,
        prefix="model.",
        head_prefixes=("lm_head.", "dense.", "classifier."),
        needs_tokenizer_json=True,
        capabilities=frozenset({"int8"}),
        missing={
            "steps": "EuroBERT's rotary positions and grouped-query heads",
            "cuda_graphs": "EuroBERT's encoder",
            "onnx": "EuroBERT's encoder (not exported yet)",
        },
    )
)
