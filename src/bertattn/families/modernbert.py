"""ModernBERT (``model_type: modernbert``), read top to bottom: config, embeddings, layer,
encoder, record.

What it changes against BERT, all in the attention's neighbourhood:

* no position table: every layer rotates its queries and keys (rotary positions), with a base
  per layer kind (``rope_parameters``: 160,000 on the global layers, 10,000 on the local ones);
* local layers: most layers attend within a window, ``|i - j| <= local_attention // 2`` (64 for
  the released 128), one layer in ``global_attn_every_n_layers`` (3) sees every key
  (``layer_types``: ``full_attention`` / ``sliding_attention``);
* pre-norm blocks (``x + attn(norm(x))``), the first layer's attention norm an identity, a final
  norm after the last layer; LayerNorms without a bias, linear layers without one;
* a gated feed-forward (GeGLU): ``Wi`` projects to ``2 I``, its first half activated and
  multiplied by its second;
* no token types (a text pair's second segment is not told apart), no pooler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ..blocks import (
    EncoderBlock,
    GatedFeedForward,
    LayerKind,
    RotaryEncoder,
    TokenEmbeddings,
    activation,
    make_norm,
)
from ..errors import ModelFolderError
from .config_fields import known_activation
from .registry import Family, HeadSpec, register, task_classes
from .rope import even_head_size, rope_object, rope_theta, rotary_attention

__all__ = ["ModernBertArch", "ModernBertMaskedLMHead", "ModernBertSequenceHead", "read_config"]

GLOBAL, LOCAL = "full_attention", "sliding_attention"
#: transformers' bases when a config names none
_DEFAULT_THETA = {GLOBAL: 160_000.0, LOCAL: 10_000.0}


# ---------------------------------------------------------------------- config
@dataclass(frozen=True)
class ModernBertArch:
    """ModernBERT's settings beyond BERT's sizes."""

    layer_types: tuple[str, ...]
    #: local layers: query i sees key j when |i - j| <= window (``local_attention // 2``)
    window: int
    theta: dict[str, float]
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    activation: str
    #: the heads' settings (sequence classifier, masked LM)
    classifier_pooling: str
    classifier_activation: str
    classifier_bias: bool
    decoder_bias: bool

    def kinds(self) -> list[LayerKind]:
        """Each layer's :class:`~bertattn.blocks.LayerKind`."""
        return [
            LayerKind(self.theta[t], self.window if t == LOCAL else None) for t in self.layer_types
        ]


def _refuse(source: str, field: str, value: object, expected: str) -> ModelFolderError:
    return ModelFolderError(
        f"{source}: {field}={value!r} is not supported; bertattn loads ModernBERT checkpoints "
        f"with {expected}."
    )


def _layer_types(data: dict[str, Any], layers: int, source: str) -> tuple[str, ...]:
    types = data.get("layer_types")
    if types is None:  # older configs: one global layer every n
        every = data.get("global_attn_every_n_layers", 3)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise _refuse(source, "global_attn_every_n_layers", every, "an int >= 1")
        return tuple(LOCAL if i % every else GLOBAL for i in range(layers))
    if not isinstance(types, list) or any(t not in (GLOBAL, LOCAL) for t in types):
        raise _refuse(source, "layer_types", types, f"a list of {GLOBAL!r} / {LOCAL!r}")
    if len(types) != layers:
        raise ModelFolderError(
            f"{source}: layer_types has {len(types)} entries but num_hidden_layers is {layers}; "
            f"give one layer type per layer."
        )
    return tuple(types)


def _thetas(data: dict[str, Any], source: str) -> dict[str, float]:
    if data.get("rope_scaling") is not None:
        raise _refuse(source, "rope_scaling", data["rope_scaling"], "rope_scaling null")
    refuse = partial(_refuse, source)
    params = rope_object(data.get("rope_parameters"), "rope_parameters", refuse,
                         "a dict per layer type")  # fmt: skip
    out = {}
    for kind in (GLOBAL, LOCAL):
        field = f"rope_parameters.{kind}"
        p = rope_object(params.get(kind), field, refuse, "a dict with rope_type and rope_theta")
        rope_type = p.get("rope_type", "default")
        if rope_type != "default":
            raise refuse(f"{field}.rope_type", rope_type, "'default'")
        old = "global_rope_theta" if kind == GLOBAL else "local_rope_theta"  # older configs
        if "rope_theta" in p:
            out[kind] = rope_theta(p["rope_theta"], f"{field}.rope_theta", refuse)
        elif data.get(old) is not None:
            out[kind] = rope_theta(data[old], old, refuse)
        else:
            out[kind] = _DEFAULT_THETA[kind]
    return out


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], ModernBertArch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`ModernBertArch`."""
    layers = data.get("num_hidden_layers", 22)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise _refuse(source, "num_hidden_layers", layers, "an int >= 1")
    hidden, heads = data.get("hidden_size", 768), data.get("num_attention_heads", 12)
    even_head_size(hidden, heads, partial(_refuse, source))
    act = known_activation(data, "hidden_activation", "gelu", source)
    window = data.get("local_attention", 128)
    longest = data.get("max_position_embeddings", 8192)
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise _refuse(source, "local_attention", window, "an int >= 2 (the window's width)")
    if isinstance(longest, int) and window // 2 >= longest:
        raise ModelFolderError(
            f"{source}: local_attention={window} is larger than the model "
            f"(max_position_embeddings={longest}): a window of +-{window // 2} tokens would be "
            f"global attention; bertattn loads ModernBERT checkpoints with local_attention < "
            f"2 * max_position_embeddings."
        )
    arch = ModernBertArch(
        layer_types=_layer_types(data, layers, source),
        window=window // 2,
        theta=_thetas(data, source),
        norm_eps=float(data.get("norm_eps", 1e-5)),
        norm_bias=bool(data.get("norm_bias", False)),
        attention_bias=bool(data.get("attention_bias", False)),
        mlp_bias=bool(data.get("mlp_bias", False)),
        activation=act,
        classifier_pooling=str(data.get("classifier_pooling", "cls")),
        classifier_activation=str(data.get("classifier_activation", "gelu")),
        classifier_bias=bool(data.get("classifier_bias", False)),
        decoder_bias=bool(data.get("decoder_bias", True)),
    )
    _check_pooling(arch, source)
    sizes = {
        "model_type": "bert",
        "vocab_size": data.get("vocab_size", 50368),
        "hidden_size": data.get("hidden_size", 768),
        "num_hidden_layers": layers,
        "num_attention_heads": data.get("num_attention_heads", 12),
        "intermediate_size": data.get("intermediate_size", 1152),
        "hidden_act": act,
        "hidden_dropout_prob": data.get("mlp_dropout", 0.0),
        "attention_probs_dropout_prob": data.get("attention_dropout", 0.0),
        "max_position_embeddings": longest,
        "type_vocab_size": 2,  # token type ids are read past: a pair's segments are not told apart
        "layer_norm_eps": arch.norm_eps,
        "pad_token_id": data.get("pad_token_id", 50283),
    }
    return sizes, arch


# ---------------------------------------------------------------------- embeddings
def embeddings(config: Any) -> TokenEmbeddings:
    """Word embeddings, a LayerNorm (without bias unless ``norm_bias``) and dropout: no
    positions (the layers rotate), no token types."""
    arch: ModernBertArch = config.arch
    norm = make_norm(config.hidden_size, arch.norm_eps, bias=arch.norm_bias)
    return TokenEmbeddings(
        config.vocab_size,
        config.hidden_size,
        norm,
        padding_idx=config.pad_token_id,
        dropout=config.hidden_dropout_prob,
    )


# ---------------------------------------------------------------------- layer
def _layer(config: Any, i: int, kind: LayerKind, backend: str) -> EncoderBlock:
    """Layer ``i``: pre-norm, rotary attention (windowed on local layers), GeGLU."""
    arch: ModernBertArch = config.arch
    e = config.hidden_size
    attn = rotary_attention(config, backend, kind.theta, bias=arch.attention_bias,
                            window=kind.window)  # fmt: skip
    mlp = GatedFeedForward(
        e,
        config.intermediate_size,
        arch.activation,
        bias_in=arch.mlp_bias,
        bias_out=arch.mlp_bias,
        dropout=config.hidden_dropout_prob,
    )
    attn_norm = nn.Identity() if i == 0 else make_norm(e, arch.norm_eps, bias=arch.norm_bias)
    mlp_norm = make_norm(e, arch.norm_eps, bias=arch.norm_bias)
    return EncoderBlock(attn, mlp, attn_norm, mlp_norm, prenorm=True)


# ---------------------------------------------------------------------- encoder
def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, None]:
    """ModernBERT's embeddings and encoder (its layers, then the final norm); no pooler."""
    arch: ModernBertArch = config.arch
    kinds = arch.kinds()
    layers = [_layer(config, i, kind, backend) for i, kind in enumerate(kinds)]
    final = make_norm(config.hidden_size, arch.norm_eps, bias=arch.norm_bias)
    return embeddings(config), RotaryEncoder(layers, kinds, final), None


# ---------------------------------------------------------------------- heads
class _PredictionHead(nn.Module):
    """ModernBERT's prediction head, before its classifier or decoder: dense (a bias when
    ``classifier_bias``), ``classifier_activation``, LayerNorm: ``(..., E) -> (..., E)``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        arch: ModernBertArch = config.arch
        e = config.hidden_size
        self.dense = nn.Linear(e, e, bias=arch.classifier_bias)
        self.act = activation(arch.classifier_activation, "classifier_activation")
        self.norm = make_norm(e, arch.norm_eps, bias=arch.norm_bias)

    def transform(self, hidden: Tensor) -> Tensor:
        """``(..., E) -> (..., E)``: the layers before the classifier or the decoder."""
        return self.norm(self.act(self.dense(hidden)))


class ModernBertSequenceHead(_PredictionHead):
    """ModernBERT's sequence classifier: the tokens pooled (``classifier_pooling``: the first
    token, or the mean over real tokens), the prediction head, then the classifier:
    ``(B, L, E)`` and the mask ``(B, L)`` -> ``(B, num_labels)``."""

    def __init__(self, config: Any, num_labels: int) -> None:
        super().__init__(config)
        self.pooling = config.arch.classifier_pooling
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        hidden = hidden.float()
        if self.pooling == "mean":
            m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)  # (B, E)
        else:
            pooled = hidden[:, 0]  # (B, E): [CLS]
        return self.classifier(self.transform(pooled))


def _prediction_tensors(config: Any) -> dict[str, tuple[int, ...]]:
    """The prediction head's tensors (``head.``), name -> shape."""
    arch: ModernBertArch = config.arch
    e = config.hidden_size
    out: dict[str, tuple[int, ...]] = {"head.dense.weight": (e, e), "head.norm.weight": (e,)}
    if arch.classifier_bias:
        out["head.dense.bias"] = (e,)
    if arch.norm_bias:
        out["head.norm.bias"] = (e,)
    return out


def _sequence_tensors(config: Any, num_labels: int) -> dict[str, tuple[int, ...]]:
    e = config.hidden_size
    out = _prediction_tensors(config)
    out.update({"classifier.weight": (num_labels, e), "classifier.bias": (num_labels,)})
    return out


def _sequence_head(config: Any, num_labels: int, tensors: dict[str, Tensor]) -> nn.Module:
    head = ModernBertSequenceHead(config, num_labels)
    state = {k.replace("head.", "", 1) if k.startswith("head.") else k: v
             for k, v in tensors.items()}  # fmt: skip
    head.load_state_dict(state, strict=True)
    return head.eval()


class ModernBertMaskedLMHead(_PredictionHead):
    """ModernBERT's masked-LM head: the prediction head, then the decoder to the vocabulary,
    tied to the word embeddings, plus a bias: ``(..., E) -> (..., V)`` logits."""

    def __init__(self, config: Any, decoder: Tensor) -> None:
        super().__init__(config)
        self.decoder = decoder  # (V, E)
        bias = config.arch.decoder_bias
        self.bias = nn.Parameter(torch.zeros(decoder.shape[0])) if bias else None

    def decode(self, transformed: Tensor) -> Tensor:
        """``(..., E) -> (..., V)`` logits of transformed states."""
        return torch.nn.functional.linear(transformed, self.decoder, self.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decode(self.transform(hidden.float()))


def _mlm_tensors(config: Any, vocab: int) -> dict[str, tuple[int, ...]]:
    out = _prediction_tensors(config)
    if config.arch.decoder_bias:
        out["decoder.bias"] = (vocab,)
    return out


def _mlm_head(config: Any, vocab: int, tensors: dict[str, Tensor]) -> nn.Module:
    decoder = tensors.get("decoder.weight", tensors["@word_embeddings"])
    head = ModernBertMaskedLMHead(config, decoder.float())
    state = {k.replace("head.", "", 1): v for k, v in tensors.items() if k.startswith("head.")}
    if "decoder.bias" in tensors:
        state["bias"] = tensors["decoder.bias"]
    head.load_state_dict(state, strict=True)
    return head.eval()


def _check_pooling(arch: ModernBertArch, source: str) -> None:
    if arch.classifier_pooling not in ("cls", "mean"):
        raise _refuse(source, "classifier_pooling", arch.classifier_pooling, "'cls' or 'mean'")


# ---------------------------------------------------------------------- record
_WQKV = re.compile(r"^((?:model\.)?layers\.\d+\.attn\.)Wqkv\.(weight|bias)$")


def rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """The checkpoint's fused ``attn.Wqkv`` ``(3E, E)`` split into ``Wq``, ``Wk``, ``Wv`` (the
    article's three projections); every other name as it is."""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        m = _WQKV.match(key)
        if m is None:
            out[key] = tensor
            continue
        for part, piece in zip(("Wq", "Wk", "Wv"), tensor.chunk(3, dim=0), strict=True):
            out[f"{m.group(1)}{part}.{m.group(2)}"] = piece
    return out


def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """ModernBERT's names (after :func:`rename`, without ``model.``) -> bertattn's."""
    arch: ModernBertArch = config.arch
    kinds = ["weight", "bias"]
    norm = kinds if arch.norm_bias else ["weight"]
    attn = kinds if arch.attention_bias else ["weight"]
    mlp = kinds if arch.mlp_bias else ["weight"]
    keys = {"embeddings.tok_embeddings.weight": "embeddings.word.weight"}
    keys.update({f"embeddings.norm.{p}": f"embeddings.norm.{p}" for p in norm})
    for i in range(config.num_hidden_layers):
        theirs, ours = f"layers.{i}.", f"encoder.layers.{i}."
        for p in attn:
            for a, b in (("Wq", "q_linear"), ("Wk", "k_linear"), ("Wv", "v_linear"),
                         ("Wo", "out_linear")):  # fmt: skip
                keys[f"{theirs}attn.{a}.{p}"] = f"{ours}attn.{b}.{p}"
        for p in mlp:
            keys[f"{theirs}mlp.Wi.{p}"] = f"{ours}mlp.w_in.{p}"
            keys[f"{theirs}mlp.Wo.{p}"] = f"{ours}mlp.w_out.{p}"
        for p in norm:
            if i:  # the first layer's attention norm is an identity
                keys[f"{theirs}attn_norm.{p}"] = f"{ours}attn_norm.{p}"
            keys[f"{theirs}mlp_norm.{p}"] = f"{ours}mlp_norm.{p}"
    keys.update({f"final_norm.{p}": f"encoder.final_norm.{p}" for p in norm})
    return keys


register(
    Family(
        "modernbert",
        "ModernBERT",
        read_config,
        rename,
        key_map,
        build,
        prefix="model.",
        head_prefixes=("head.", "decoder.", "classifier."),
        capabilities=frozenset({"onnx", "int8"}),
        # its own heads (pooling, dense, activation, LayerNorm), below
        head_classes=task_classes("ModernBert", "sequence-classification", "masked-lm"),
        heads={
            "sequence-classification": HeadSpec(_sequence_tensors, _sequence_head),
            "masked-lm": HeadSpec(
                _mlm_tensors,
                _mlm_head,
                optional=lambda c, v: {"decoder.weight": (v, c.hidden_size)},
            ),
        },
        missing={
            "steps": "ModernBERT's rotary positions and local windows",
            "cuda_graphs": "ModernBERT's encoder",
        },
    )
)
