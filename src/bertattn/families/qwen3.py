"""Qwen3 (``model_type: qwen3``: the Qwen3-Embedding backbones), read top to bottom: config,
embeddings, layer, encoder, names, record.

What it changes against BERT, in the attention and around it:

* grouped-query heads: ``num_key_value_heads`` key/value heads, each shared by
  ``num_attention_heads / num_key_value_heads`` query heads, of ``head_dim`` each (not
  ``hidden_size / num_attention_heads``);
* q/k norms: an RMSNorm over the head size on every query and key head before the rotation;
* rotary positions (``rope_parameters.rope_theta``), no position table, no token types;
* causal attention, a decoder's: query ``i`` sees keys ``j <= i``. A bidirectional embedder of
  the same backbone says so in its config (``use_bidirectional_attention: true``, or
  ``is_causal: false``) and every query sees every key;
* pre-norm blocks with RMSNorm (``x + attn(norm(x))``), a final norm; a SiLU-gated
  feed-forward (``down(act(gate(x)) * up(x))``); no bias but the four attention projections'
  when ``attention_bias``; no pooler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..blocks import (
    EncoderBlock,
    GatedFeedForward,
    LayerKind,
    RotaryEncoder,
    TokenEmbeddings,
    make_norm,
)
from ..errors import ModelFolderError
from .config_fields import decoder_sizes, known_activation, kv_heads, positive, refuse, rope_theta
from .registry import Family, HeadSpec, register, task_classes
from .rope import rotary_attention
from .rotary_bert import Variant, attention_keys, rename

__all__ = ["Qwen3Arch", "decoder_family", "read_config"]


# ---------------------------------------------------------------------- config
#: the checkpoint's names as :func:`.rotary_bert.rename` reads them: ``mlp.gate_proj`` and
#: ``mlp.up_proj`` joined into one ``(2I, E)`` ``mlp.gate_up`` (the activated gate first, as
#: :class:`~bertattn.blocks.GatedFeedForward` keeps it); every other name as it is
NAMES = Variant(
    name="qwen3",
    title="Qwen3",
    prefix="model.",
    default_theta=1_000_000.0,
    default_act="silu",
)


@dataclass(frozen=True)
class Qwen3Arch:
    """Qwen3's settings beyond BERT's sizes."""

    kv_heads: int
    head_dim: int
    theta: float
    norm_eps: float
    attention_bias: bool
    causal: bool
    #: the names :func:`.rotary_bert.rename` reads (the same renaming as GTE's gated layers)
    variant: Variant = NAMES
    #: an RMSNorm on every query and key head (EuroBERT has none)
    qk_norm: bool = True
    #: biases on the feed-forward's three projections (EuroBERT's ``mlp_bias``)
    mlp_bias: bool = False


#: the name refusals give the family
TITLE = "Qwen3"
#: the sizes where the config has none (:func:`.config_fields.decoder_sizes`)
DEFAULTS = {
    "vocab_size": 151936,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "pad_token_id": None,
}


def _refuse(source: str, field: str, value: object, expected: str) -> ModelFolderError:
    return refuse(source, TITLE, field, value, expected)


def _positive(data: dict[str, Any], field: str, default: int, source: str) -> int:
    return positive(data, field, default, source, TITLE)


def _causal(data: dict[str, Any], source: str) -> bool:
    """Causal unless the config asks for bidirectional attention (either field)."""
    bidirectional = data.get("use_bidirectional_attention", False)
    is_causal = data.get("is_causal", True)
    if not isinstance(bidirectional, bool) or not isinstance(is_causal, bool):
        raise _refuse(source, "use_bidirectional_attention / is_causal",
                      (bidirectional, is_causal), "booleans")  # fmt: skip
    if data.get("use_sliding_window", False):  # a window on some layers: not implemented
        raise _refuse(source, "use_sliding_window", True, "use_sliding_window false")
    return is_causal and not bidirectional


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], Qwen3Arch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`Qwen3Arch`."""
    layers = _positive(data, "num_hidden_layers", 28, source)
    heads = _positive(data, "num_attention_heads", 16, source)
    kv = kv_heads(data, heads, heads, source, TITLE)
    hidden = _positive(data, "hidden_size", 1024, source)
    act = known_activation(data, "hidden_act", "silu", source)
    arch = Qwen3Arch(
        kv_heads=kv,
        head_dim=_positive(data, "head_dim", hidden // heads, source),
        theta=rope_theta(data, 1_000_000.0, source, TITLE),
        norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        attention_bias=bool(data.get("attention_bias", False)),
        causal=_causal(data, source),
    )
    sizes = decoder_sizes(data, (hidden, layers, heads), act, arch.norm_eps, DEFAULTS)
    return sizes, arch


# ---------------------------------------------------------------------- embeddings
def embeddings(config: Any) -> TokenEmbeddings:
    """Word embeddings only: no positions (the layers rotate), no token types, no norm."""
    return TokenEmbeddings(config.vocab_size, config.hidden_size, nn.Identity(),
                           padding_idx=config.pad_token_id)  # fmt: skip


# ---------------------------------------------------------------------- layer
def grouped_attention(config: Any, backend: str, theta: float, **extra: Any) -> MultiHeadAttention:
    """The rotary attention (base ``theta``) with ``config.arch``'s grouped-query heads
    (``kv_heads`` key/value heads of ``head_dim``), projection biases (``attention_bias``) and
    q/k norms' epsilon (``norm_eps``); Gemma 3's too. ``extra``: the other keywords of
    :class:`~bertattn.MultiHeadAttention` (``causal``, ``qk_norm``, ``window``, ``scale``)."""
    arch = config.arch
    return rotary_attention(config, backend, theta, bias=arch.attention_bias,
                            num_kv_heads=arch.kv_heads, head_dim=arch.head_dim,
                            norm_eps=arch.norm_eps, **extra)  # fmt: skip


def layer(config: Any, backend: str) -> EncoderBlock:
    """One layer: RMSNorm, grouped-query attention with rotation (causal unless the config is
    bidirectional; q/k norms when ``arch.qk_norm``), RMSNorm, the SiLU-gated feed-forward (its
    projections biased when ``arch.mlp_bias``). EuroBERT's layer too."""
    arch: Qwen3Arch = config.arch
    e = config.hidden_size
    attn = grouped_attention(config, backend, arch.theta, causal=arch.causal, qk_norm=arch.qk_norm)
    mlp = GatedFeedForward(e, config.intermediate_size, config.hidden_act,
                           bias_in=arch.mlp_bias, bias_out=arch.mlp_bias)  # fmt: skip
    norms = [make_norm(e, arch.norm_eps, bias=False, kind="rms_norm") for _ in range(2)]
    return EncoderBlock(attn, mlp, *norms, prenorm=True)


# ---------------------------------------------------------------------- encoder
def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, None]:
    """Qwen3's (and EuroBERT's) embeddings and encoder (its layers, then the final RMSNorm); no
    pooler."""
    arch: Qwen3Arch = config.arch
    n = config.num_hidden_layers
    layers = [layer(config, backend) for _ in range(n)]
    final = make_norm(config.hidden_size, arch.norm_eps, bias=False, kind="rms_norm")
    return embeddings(config), RotaryEncoder(layers, [LayerKind(arch.theta)] * n, final), None


# ---------------------------------------------------------------------- heads
class Qwen3SequenceHead(nn.Module):
    """``Qwen3ForSequenceClassification``'s head: the ``score`` layer (no bias) on the last real
    token of each row (right or left padding): ``(B, L, E)`` and the mask ``(B, L)`` ->
    ``(B, num_labels)``. transformers picks the last token that is not ``pad_token_id``: the
    same token wherever the pad id is not a token of the text."""

    def __init__(self, width: int, num_labels: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(width, num_labels, bias=False)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        positions = torch.arange(mask.shape[-1], device=mask.device)  # (L,)
        last = (positions * (mask != 0)).argmax(-1)  # (B,): each row's last real token
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.classifier(hidden[rows, last].float())  # (B, num_labels)


def _sequence_head(config: Any, num_labels: int, tensors: dict[str, Tensor]) -> nn.Module:
    head = Qwen3SequenceHead(config.hidden_size, num_labels)
    head.classifier.weight.data.copy_(tensors["score.weight"])
    return head.eval()


SEQUENCE_HEAD = HeadSpec(lambda c, n: {"score.weight": (n, c.hidden_size)}, _sequence_head)


# ---------------------------------------------------------------------- names
def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """Qwen3's names (after :func:`.rotary_bert.rename`, without ``model.``) -> bertattn's."""
    arch: Qwen3Arch = config.arch
    attn = ["weight", "bias"] if arch.attention_bias else ["weight"]
    keys = {"embed_tokens.weight": "embeddings.word.weight"}
    for i in range(config.num_hidden_layers):
        theirs, ours = f"layers.{i}.", f"encoder.layers.{i}."
        keys.update(attention_keys(theirs, ours, attn))
        for a in ("q_norm", "k_norm"):
            keys[f"{theirs}self_attn.{a}.weight"] = f"{ours}attn.{a}.weight"
        keys[f"{theirs}mlp.gate_up.weight"] = f"{ours}mlp.w_in.weight"
        keys[f"{theirs}mlp.down_proj.weight"] = f"{ours}mlp.w_out.weight"
        keys[f"{theirs}input_layernorm.weight"] = f"{ours}attn_norm.weight"
        keys[f"{theirs}post_attention_layernorm.weight"] = f"{ours}mlp_norm.weight"
    keys["norm.weight"] = "encoder.final_norm.weight"
    return keys


def decoder_family(
    name: str, title: str, read: Any, key_map: Any, build: Any, *, steps: str, **record: Any
) -> Family:
    """The record of a decoder-born family on Qwen3's layers (Qwen3, Gemma 3, EuroBERT): the
    base model under ``model.``, names read by :func:`.rotary_bert.rename`, a tokenizer.json
    required, the steps view missing for ``steps`` and the CUDA graphs and ONNX export for
    its encoder; ``record``: the rest of :class:`~.registry.Family`'s fields (``missing``:
    more missing capabilities)."""
    missing = {
        "steps": steps,
        **record.pop("missing", {}),
        "cuda_graphs": f"{title}'s encoder",
        "onnx": f"{title}'s encoder (not exported yet)",
    }
    record.setdefault("head_prefixes", ("lm_head.", "score."))
    return Family(name, title, read, rename, key_map, build, prefix="model.",
                  needs_tokenizer_json=True, missing=missing, **record)  # fmt: skip


register(
    decoder_family(
        "qwen3",
        "Qwen3",
        read_config,
        key_map,
        build,
        steps="Qwen3's grouped-query heads, q/k norms and rotary positions",
        capabilities=frozenset({"int8"}),
        head_classes=task_classes("Qwen3", "sequence-classification"),
        heads={"sequence-classification": SEQUENCE_HEAD},
    )
)
