"""DeBERTa-v2 and v3 (``model_type: deberta-v2``: DeBERTa-v3-xsmall to large, mDeBERTa-v3, the
NLI cross-encoders, classifiers and taggers built on them), read top to bottom: config,
embeddings, encoder, names, heads, record.

What it changes against BERT, in the attention and around it:

* disentangled attention (:mod:`bertattn.attention.disentangled`): every score adds a
  content-to-position term (c2p) and a position-to-content term (p2c) read from one table of
  relative position embeddings, shared by every layer (``encoder.rel_embeddings``, after a
  LayerNorm when ``norm_rel_ebd`` says ``layer_norm``), projected by each layer's own key and
  query projections (``share_att_key``); the scale becomes ``1 / sqrt(D * (1 + #terms))``;
* relative positions in log buckets (``position_buckets``, ``max_relative_positions``), and no
  absolute position table when ``position_biased_input`` is false (DeBERTa-v3);
* no token types when ``type_vocab_size`` is 0 (v3: a pair's segments are not told apart), an
  optional ``embed_proj`` when ``embedding_size`` differs from the hidden size;
* BERT's post-norm layers otherwise (``norm(x + attn(x))``, ``norm(h + ffn(h))``), no pooler in
  the encoder: a sequence classifier's ``ContextPooler`` (dense + ``pooler_hidden_act`` on the
  first token) is the head's.

DeBERTa v1 (``model_type: deberta``) and v2's convolution after the first layer
(``conv_kernel_size`` > 0: DeBERTa-v2-xlarge / xxlarge) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import MultiHeadAttention, PreparedMask
from ..attention.disentangled import TERMS
from ..blocks import EncoderBlock, FeedForward, activation, make_norm
from ..blocks.contract import LayerStack, Packing, StackInfo
from ..blocks.embeddings import TokenEmbeddings
from ..blocks.tables import embedding
from ..errors import ModelFolderError
from .config_fields import positive, refuse
from .registry import CLASSIFIERS, Family, HeadSpec, register, task_classes

__all__ = ["DebertaArch", "DebertaEmbeddings", "DisentangledEncoder", "read_config"]

#: the name refusals give the family
TITLE = "DeBERTa-v2"


# ---------------------------------------------------------------------- config
@dataclass(frozen=True)
class DebertaArch:
    """DeBERTa's settings beyond BERT's sizes.

    Attributes:
        terms: the relative terms (``pos_att_type``), in :data:`TERMS`' order.
        buckets: ``position_buckets`` (<= 0: no log buckets).
        max_relative: ``max_relative_positions``, or ``max_position_embeddings`` when < 1.
        share_att_key: the relative table projected by the layers' own query and key.
        norm_rel: a LayerNorm on the relative table (``norm_rel_ebd`` has ``layer_norm``).
        absolute: an absolute position table in the embeddings (``position_biased_input``).
        embedding_size: the width of the embedding tables (``embed_proj`` when not hidden).
        token_types: ``type_vocab_size`` (0: no token-type table).
        pooler_act: the sequence classifier's ``pooler_hidden_act``.
    """

    terms: tuple[str, ...]
    buckets: int
    max_relative: int
    share_att_key: bool
    norm_rel: bool
    absolute: bool
    embedding_size: int
    token_types: int
    pooler_act: str

    @property
    def span(self) -> int:
        """S: the relative table has ``2S`` rows."""
        return self.buckets if self.buckets > 0 else self.max_relative


def _refuse(source: str, field: str, value: object, expected: str) -> ModelFolderError:
    return refuse(source, TITLE, field, value, expected)


def _terms(data: dict[str, Any], source: str) -> tuple[str, ...]:
    """``pos_att_type`` (a list, or v2's ``"p2c|c2p"`` string) as relative terms."""
    raw = data.get("pos_att_type") or []
    terms = [t.strip().lower() for t in raw.split("|")] if isinstance(raw, str) else raw
    if not data.get("relative_attention", False):
        why = "relative_attention true (DeBERTa-v2/v3's disentangled attention)"
        raise _refuse(source, "relative_attention", data.get("relative_attention"), why)
    if not isinstance(terms, list) or not terms or any(t not in TERMS for t in terms):
        raise _refuse(source, "pos_att_type", raw, 'terms from ["c2p", "p2c"] (e.g. "p2c|c2p")')
    return tuple(t for t in TERMS if t in terms)


def _checked(data: dict[str, Any], source: str, hidden: int, heads: int) -> None:
    """Refuse what bertattn does not run: the convolution, another head size, another pooler
    width, an unknown activation."""
    if data.get("conv_kernel_size", 0):
        raise _refuse(source, "conv_kernel_size", data["conv_kernel_size"],
                      "0 (the convolution after the first layer of DeBERTa-v2-xlarge is not "
                      "implemented)")  # fmt: skip
    head_size = data.get("attention_head_size", hidden // heads)
    if hidden % heads or head_size != hidden // heads:
        raise _refuse(source, "attention_head_size", head_size,
                      f"hidden_size / num_attention_heads ({hidden} / {heads})")  # fmt: skip
    if data.get("pooler_hidden_size", hidden) != hidden:
        raise _refuse(source, "pooler_hidden_size", data["pooler_hidden_size"],
                      f"hidden_size ({hidden})")  # fmt: skip
    for field, default in (("hidden_act", "gelu"), ("pooler_hidden_act", "gelu")):
        try:
            activation(data.get(field, default), field)
        except ValueError as exc:
            raise ModelFolderError(f"{source}: {exc}") from None


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], DebertaArch]:
    """``config.json`` -> BERT's sizes (every job reads those) and :class:`DebertaArch`."""
    hidden = positive(data, "hidden_size", 1536, source, TITLE)
    heads = positive(data, "num_attention_heads", 24, source, TITLE)
    _checked(data, source, hidden, heads)
    max_pos = positive(data, "max_position_embeddings", 512, source, TITLE)
    max_relative = data.get("max_relative_positions", -1)
    buckets = data.get("position_buckets", -1)
    if not isinstance(max_relative, int) or not isinstance(buckets, int):
        raise _refuse(source, "position_buckets / max_relative_positions",
                      (buckets, max_relative), "integers")  # fmt: skip
    types = data.get("type_vocab_size", 0)
    arch = DebertaArch(
        terms=_terms(data, source),
        buckets=buckets,
        max_relative=max_relative if max_relative >= 1 else max_pos,
        share_att_key=bool(data.get("share_att_key", False)),
        norm_rel="layer_norm" in str(data.get("norm_rel_ebd", "none")).lower().split("|"),
        absolute=bool(data.get("position_biased_input", True)),
        embedding_size=positive(data, "embedding_size", hidden, source, TITLE),
        token_types=types if isinstance(types, int) and types > 0 else 0,
        pooler_act=data.get("pooler_hidden_act", "gelu"),
    )
    sizes = {
        "model_type": "bert",
        "vocab_size": data.get("vocab_size", 128100),
        "hidden_size": hidden,
        "num_hidden_layers": positive(data, "num_hidden_layers", 24, source, TITLE),
        "num_attention_heads": heads,
        "intermediate_size": data.get("intermediate_size", 6144),
        "hidden_act": data.get("hidden_act", "gelu"),
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": data.get("attention_probs_dropout_prob", 0.0),
        "max_position_embeddings": max_pos,
        # without a table the tokenizer's token types are read past (a pair's are 0 and 1)
        "type_vocab_size": max(arch.token_types, 2),
        "layer_norm_eps": data.get("layer_norm_eps", 1e-7),
        "pad_token_id": data.get("pad_token_id", 0),
        "embedding_size": None if arch.embedding_size == hidden else arch.embedding_size,
    }
    return sizes, arch


# ---------------------------------------------------------------------- embeddings
class DebertaEmbeddings(TokenEmbeddings):
    """``(B, L)`` ids -> ``(B, L, E)`` (packed: ``(T,)`` -> ``(T, E)``): ``word`` (+
    ``position`` when ``position_biased_input``, + ``token_type`` when the model has token
    types), ``proj`` to the hidden size when the tables are narrower, then ``norm``."""

    def __init__(self, config: Any) -> None:
        arch: DebertaArch = config.arch
        width, hidden = arch.embedding_size, config.hidden_size
        norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        super().__init__(config.vocab_size, width, norm, padding_idx=config.pad_token_id,
                         token_types=arch.token_types)  # fmt: skip
        self.position = embedding(config.max_position_embeddings, width) if arch.absolute else None
        self.proj = nn.Linear(width, hidden, bias=False) if width != hidden else None

    def add_positions(self, x: Tensor, position_ids: Tensor | None) -> Tensor:
        """``x`` plus the absolute position table's rows (none without the table)."""
        if self.position is None:
            return x
        if position_ids is None:
            position_ids = torch.arange(x.shape[-2], device=x.device)
        return x + self.position(position_ids)

    def finish(self, x: Tensor) -> Tensor:
        """``proj`` to the hidden size (when narrower), then the norm: ``(..., L, E)``."""
        if self.proj is not None:
            x = self.proj(x)
        return self.norm(x)


# ---------------------------------------------------------------------- encoder
def _layer(config: Any, backend: str) -> EncoderBlock:
    """One post-norm layer: disentangled attention, LayerNorm, BERT's feed-forward, LayerNorm."""
    arch: DebertaArch = config.arch
    e, eps = config.hidden_size, config.layer_norm_eps
    attn = MultiHeadAttention(
        e,
        config.num_attention_heads,
        config.attention_probs_dropout_prob,
        backend=backend,
        disentangled=arch.terms,
        position_buckets=arch.buckets,
        max_relative_positions=arch.max_relative,
        share_att_key=arch.share_att_key,
    )
    mlp = FeedForward(e, config.intermediate_size, config.hidden_act)
    return EncoderBlock(attn, mlp, make_norm(e, eps), make_norm(e, eps), prenorm=False)


class DisentangledEncoder(LayerStack):
    """DeBERTa's layers and the relative position table they share: ``rel_embeddings``
    ``(2S, E)``, normalized by ``rel_norm`` (None: as it is) once per forward, then projected
    by each layer (:meth:`bertattn.MultiHeadAttention.relative_terms`)."""

    def __init__(self, layers: list[EncoderBlock], span: int, width: int, norm: nn.Module | None):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.rel_embeddings = embedding(2 * span, width)
        self.rel_norm = norm

    @property
    def info(self) -> StackInfo:
        """Packed: yes (every sequence reads the corner of the relative indices it needs); the
        relative terms are the attention's own input, not a bias of the mask; no lean path."""
        return StackInfo(packed=True, relative_bias=False, lean=False)

    def _table(self) -> Tensor:
        """The shared relative table ``(2S, E)``, after its norm, in the compute dtype."""
        table = self.rel_embeddings.weight
        if self.rel_norm is not None:
            table = self.rel_norm(table)
        return table.to(self.compute_dtype(table.dtype))

    def padded_state(
        self, hidden: Tensor, mask: PreparedMask, output_attentions: frozenset[int]
    ) -> Tensor:
        """The shared relative table (each layer projects it)."""
        return self._table()

    def padded_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, mask: PreparedMask, want: bool, state: Any
    ) -> tuple[Tensor, Tensor | None]:
        """Layer ``i`` with its relative terms over the batch's length."""
        length = hidden.shape[1]
        terms = layer.attn.relative_terms(state, length, length)
        return layer.run_padded(hidden, mask, want, relative=terms)

    def packed_state(self, hidden: Tensor, packing: Packing) -> Tensor:
        """The shared relative table (each layer projects it)."""
        return self._table()

    def packed_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, packing: Packing, state: Any
    ) -> Tensor:
        """Layer ``i`` on ``packing.backend`` with the relative terms of the longest sequence
        (each reads its corner)."""
        longest = packing.batch.max_seqlen
        terms = layer.attn.relative_terms(state, longest, longest)
        return layer.run_packed(hidden, packing, relative=terms)


def build(config: Any, backend: str, pooler: bool) -> tuple[nn.Module, nn.Module, None]:
    """DeBERTa's embeddings and encoder (its layers and their relative table); no pooler."""
    arch: DebertaArch = config.arch
    layers = [_layer(config, backend) for _ in range(config.num_hidden_layers)]
    e = config.hidden_size
    norm = make_norm(e, config.layer_norm_eps) if arch.norm_rel else None
    return DebertaEmbeddings(config), DisentangledEncoder(layers, arch.span, e, norm), None


# ---------------------------------------------------------------------- names
#: the layer's names in the checkpoint -> bertattn's, under ``encoder.layer.N.``
_LAYER = {
    "attention.self.query_proj": "attn.q_linear",
    "attention.self.key_proj": "attn.k_linear",
    "attention.self.value_proj": "attn.v_linear",
    "attention.self.pos_key_proj": "attn.pos_key_proj",
    "attention.self.pos_query_proj": "attn.pos_query_proj",
    "attention.output.dense": "attn.out_linear",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "mlp_norm",
}


def _layer_names(arch: DebertaArch) -> dict[str, str]:
    """:data:`_LAYER` without the position projections this config has none of."""
    own = not arch.share_att_key
    drop = {"attention.self.pos_key_proj": not (own and "c2p" in arch.terms),
            "attention.self.pos_query_proj": not (own and "p2c" in arch.terms)}  # fmt: skip
    return {k: v for k, v in _LAYER.items() if not drop.get(k, False)}


def key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """DeBERTa's names (without ``deberta.``) -> bertattn's."""
    arch: DebertaArch = config.arch
    keys = {"embeddings.word_embeddings.weight": "embeddings.word.weight"}
    optional = (
        (arch.absolute, "position_embeddings", "position"),
        (arch.token_types > 0, "token_type_embeddings", "token_type"),
        (arch.embedding_size != config.hidden_size, "embed_proj", "proj"),
    )
    for present, theirs, ours in optional:
        if present:
            keys[f"embeddings.{theirs}.weight"] = f"embeddings.{ours}.weight"
    for p in ("weight", "bias"):
        keys[f"embeddings.LayerNorm.{p}"] = f"embeddings.norm.{p}"
        if arch.norm_rel:
            keys[f"encoder.LayerNorm.{p}"] = f"encoder.rel_norm.{p}"
    keys["encoder.rel_embeddings.weight"] = "encoder.rel_embeddings.weight"
    for i in range(config.num_hidden_layers):
        for theirs, ours in _layer_names(arch).items():
            for p in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{theirs}.{p}"] = f"encoder.layers.{i}.{ours}.{p}"
    return keys


def rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """The checkpoint's tensors as they are, but for an absolute position table the config
    says is not read (``position_biased_input`` false), which transformers skips too."""
    arch: DebertaArch = config.arch
    unused = "embeddings.position_embeddings.weight"
    return {k: v for k, v in state.items() if arch.absolute or not k.endswith(unused)}


# ---------------------------------------------------------------------- heads
class DebertaSequenceHead(nn.Module):
    """DeBERTa's sequence classifier: the ``ContextPooler`` (``dense`` then
    ``pooler_hidden_act`` on the first token), then the ``classifier``: ``(B, L, E)`` and the
    mask ``(B, L)`` -> ``(B, num_labels)``; dropout is not applied at inference."""

    def __init__(self, width: int, act: str, num_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.act = activation(act, "pooler_hidden_act")
        self.classifier = nn.Linear(width, num_labels)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        return self.classifier(self.act(self.dense(hidden[:, 0].float())))  # (B, num_labels)


def _sequence_tensors(config: Any, num_labels: int) -> dict[str, tuple[int, ...]]:
    e = config.hidden_size
    return {"pooler.dense.weight": (e, e), "pooler.dense.bias": (e,),
            "classifier.weight": (num_labels, e), "classifier.bias": (num_labels,)}  # fmt: skip


def _sequence_head(config: Any, num_labels: int, tensors: dict[str, Tensor]) -> nn.Module:
    head = DebertaSequenceHead(config.hidden_size, config.arch.pooler_act, num_labels)
    head.load_state_dict({k.replace("pooler.", "", 1): v for k, v in tensors.items()})
    return head.eval()


#: the task heads' tensors in DeBERTa checkpoints (skipped when the encoder loads)
HEAD_PREFIXES = (
    "pooler.", "classifier.", "lm_predictions.", "mask_predictions.", "cls.", "qa_outputs.",
)  # fmt: skip

register(
    Family(
        "deberta-v2",
        TITLE,
        read_config,
        rename,
        key_map,
        build,
        prefix="deberta.",
        head_prefixes=HEAD_PREFIXES,
        needs_tokenizer_json=True,
        head_classes=task_classes("DebertaV2", *CLASSIFIERS),
        heads={"sequence-classification": HeadSpec(_sequence_tensors, _sequence_head)},
        missing={
            "steps": "DeBERTa's disentangled attention (the page's steps view)",
            "int8": "DeBERTa's disentangled attention",
            "cuda_graphs": "DeBERTa's encoder",
            "onnx": "DeBERTa's disentangled attention (not exported yet)",
            "compile": "DeBERTa's disentangled attention (not yet checked compiled)",
        },
    )
)
