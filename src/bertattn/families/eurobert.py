"""EuroBERT (``model_type: eurobert``: EuroBERT-210m/610m/2.1B, the base of
jina-embeddings-v5-text-nano), read top to bottom: config, names, record.

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

The layers, the encoder (:func:`.qwen3.build`), the embeddings and the checkpoint's names are
Qwen3's (:mod:`.qwen3`) without its q/k norms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from . import qwen3
from .config_fields import decoder_sizes, known_activation, kv_heads, positive, rope_theta
from .registry import register
from .rotary_bert import Variant

__all__ = ["EuroBertArch", "read_config"]


# ---------------------------------------------------------------------- config
#: the checkpoint's names: Qwen3's (:data:`.qwen3.NAMES`), with EuroBERT's rotation base
NAMES = replace(qwen3.NAMES, name="eurobert", title="EuroBERT", default_theta=10_000.0)


@dataclass(frozen=True)
class EuroBertArch(qwen3.Qwen3Arch):
    """EuroBERT's settings beyond BERT's sizes: Qwen3's (``causal`` always False, no q/k
    norms), and biases on the feed-forward's three projections when ``mlp_bias``."""

    variant: Variant = NAMES
    qk_norm: bool = False


def _positive(data: dict[str, Any], field: str, default: int, source: str) -> int:
    return positive(data, field, default, source, NAMES.title)


def _arch(data: dict[str, Any], hidden: int, heads: int, source: str) -> EuroBertArch:
    return EuroBertArch(
        kv_heads=kv_heads(data, heads, heads, source, NAMES.title),
        head_dim=_positive(data, "head_dim", hidden // heads, source),
        theta=rope_theta(data, NAMES.default_theta, source, NAMES.title),
        norm_eps=float(data.get("rms_norm_eps", 1e-5)),
        attention_bias=bool(data.get("attention_bias", False)),
        causal=False,
        mlp_bias=bool(data.get("mlp_bias", False)),
    )


#: the sizes where the config has none (:func:`.config_fields.decoder_sizes`)
DEFAULTS = {
    "vocab_size": 128256,
    "intermediate_size": 3072,
    "max_position_embeddings": 8192,
    "pad_token_id": None,
}


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], EuroBertArch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`EuroBertArch`."""
    hidden = _positive(data, "hidden_size", 768, source)
    heads = _positive(data, "num_attention_heads", 12, source)
    act = known_activation(data, "hidden_act", "silu", source)
    arch = _arch(data, hidden, heads, source)
    layers = _positive(data, "num_hidden_layers", 12, source)
    return decoder_sizes(data, (hidden, layers, heads), act, arch.norm_eps, DEFAULTS), arch


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
    qwen3.decoder_family(
        "eurobert",
        "EuroBERT",
        read_config,
        key_map,
        qwen3.build,
        steps="EuroBERT's rotary positions and grouped-query heads",
        head_prefixes=("lm_head.", "dense.", "classifier."),
        capabilities=frozenset({"int8"}),
    )
)
