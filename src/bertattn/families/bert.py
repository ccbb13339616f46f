"""BERT and the families that are BERT's layers under other names: RoBERTa, XLM-RoBERTa and
ELECTRA. Each is a record over the same encoder (:class:`bertattn.encoder.model.BertModel`'s own
embeddings, post-LayerNorm layers and pooler); what differs is read here.

RoBERTa and XLM-RoBERTa (``roberta``, ``xlm-roberta``) are BERT's layers under ``roberta.``;
their positions are numbered from ``pad_token_id + 1``, so the position table's first rows are
never used by a right-padded input: they are dropped and the encoder numbers positions from 0,
as BERT does (the same vectors). Their one token type is given to both segments of a pair, and
a sequence-classification head's ``classifier.dense`` / ``classifier.out_proj`` are BERT's
pooler and classifier. Their tokenizers (byte-level BPE, SentencePiece) come from the folder's
``tokenizer.json``.

ELECTRA (``electra``: the discriminator's encoder) is BERT's layers under ``electra.``, without
a pooler; when its ``embedding_size`` differs from ``hidden_size`` (ELECTRA-small), the
embeddings are that narrow and its ``embeddings_project`` (a linear layer to the hidden size)
follows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .registry import CLASSIFIERS, Family, register, task_classes

__all__ = [
    "BERT_CAPABILITIES",
    "BERT_HEADS",
    "bert_family",
    "bert_key_map",
    "build_bert",
    "drop_keys",
    "offset_positions",
    "roberta_head_name",
]

#: task heads of BertFor* (and the family's) models: skipped (and reported) when loading
BERT_HEADS = (
    "cls.",
    "classifier.",
    "qa_outputs.",
    "pre_classifier.",
    "lm_head.",
    "vocab_transform.",  # DistilBERT's masked-LM head
    "vocab_layer_norm.",
    "vocab_projector.",
    "discriminator_predictions.",  # ELECTRA's heads
    "generator_predictions.",
    "generator_lm_head.",
    "linear.",  # Stanford ColBERT's projection (HF_ColBERT), read by MultiVectorEncoder
)
#: what every family on BERT's layer can do
BERT_CAPABILITIES = frozenset(
    {"int8", "onnx", "steps", "cuda_graphs", "token_types", "compile"}
)

_GLOBAL = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
_PER_LAYER = {
    "attention.self.query": "attn.q_linear",
    "attention.self.key": "attn.k_linear",
    "attention.self.value": "attn.v_linear",
    "attention.output.dense": "attn.out_linear",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "mlp_norm",
}
#: MPNet's relative position bias table (buckets x heads), the same name in both
_RELATIVE = "encoder.relative_attention_bias.weight"
_POOLER = {"pooler.dense.weight": "pooler.dense.weight", "pooler.dense.bias": "pooler.dense.bias"}


def bert_key_map(config: Any, pooler: bool = True) -> dict[str, str]:
    """Every Hugging Face ``BertModel`` parameter name -> its bertattn name, for ``config``."""
    keys = dict(_GLOBAL)
    for i in range(config.num_hidden_layers):
        for hf, ours in _PER_LAYER.items():
            for p in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{hf}.{p}"] = f"encoder.layers.{i}.{ours}.{p}"
    if pooler:
        keys.update(_POOLER)
    if config.relative_attention_num_buckets:  # MPNet: one table, shared by every layer
        keys[_RELATIVE] = _RELATIVE
    if config.embedding_size not in (None, config.hidden_size):  # ELECTRA-small
        for p in ("weight", "bias"):
            keys[f"embeddings_project.{p}"] = f"embeddings.project.{p}"
    return keys


def build_bert(
    config: Any, backend: str, pooler: bool
) -> tuple[nn.Module, nn.Module, nn.Module | None]:
    """BERT's embeddings, post-LayerNorm encoder and (if ``pooler``) pooler."""
    from .bert_layers import BertEmbeddings, BertEncoder, BertPooler

    return (
        BertEmbeddings(config),
        BertEncoder(config, backend),
        BertPooler(config) if pooler else None,
    )


def drop_keys(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``data`` without ``keys`` (settings another family reads)."""
    return {k: v for k, v in data.items() if k not in keys}


def _read_bert(data: dict[str, Any], source: str) -> tuple[dict[str, Any], None]:
    return drop_keys(data, "embedding_size", "relative_attention_num_buckets"), None


def _renamed_prefix(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """``prefix`` (``electra.``) read as ``bert.``."""
    n = len(prefix)
    return {("bert." + k[n:] if k.startswith(prefix) else k): v for k, v in state.items()}


# ---------------------------------------------------------------------- RoBERTa, XLM-RoBERTa
def roberta_offset(data: dict[str, Any]) -> int:
    """RoBERTa numbers positions from ``pad_token_id + 1`` (2 for its checkpoints)."""
    return int(data.get("pad_token_id", 1)) + 1


def offset_config(data: dict[str, Any], offset: int) -> dict[str, Any]:
    """A config whose position table loses its first ``offset`` rows, with two token types."""
    out = {**data, "model_type": "bert", "type_vocab_size": 2}
    if "max_position_embeddings" in data:
        out["max_position_embeddings"] = int(data["max_position_embeddings"]) - offset
    return out


def _read_roberta(data: dict[str, Any], source: str) -> tuple[dict[str, Any], None]:
    data = drop_keys(data, "embedding_size", "relative_attention_num_buckets")
    return offset_config(data, roberta_offset(data)), None


def roberta_head_name(key: str, prefixed: bool) -> str:
    """A RoBERTa sequence-classification head's tensor under BERT's names: its
    ``classifier.dense`` (dense + tanh on the first token) is BERT's pooler, its
    ``classifier.out_proj`` BERT's classifier."""
    if key.startswith("classifier.dense."):
        return ("bert." if prefixed else "") + "pooler.dense." + key.split(".", 2)[2]
    if key.startswith("classifier.out_proj."):
        return "classifier." + key.split(".", 2)[2]
    return key


def offset_positions(state: dict[str, Tensor], offset: int, prefix: str) -> dict[str, Tensor]:
    """Tensors under BERT's names: ``prefix`` as ``bert.``, the position table without its first
    ``offset`` rows, one token type repeated for the second segment, a classification head as
    BERT's pooler and classifier (:func:`roberta_head_name`)."""
    prefixed = any(k.startswith(prefix) for k in state)
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        name = "bert." + key[len(prefix) :] if key.startswith(prefix) else key
        name = roberta_head_name(name, prefixed)
        if name.endswith("embeddings.position_embeddings.weight"):
            tensor = tensor[offset:]
        elif name.endswith("embeddings.token_type_embeddings.weight") and tensor.shape[0] == 1:
            tensor = tensor.expand(2, -1).clone()
        out[name] = tensor
    return out


# ---------------------------------------------------------------------- ELECTRA
def _read_electra(data: dict[str, Any], source: str) -> tuple[dict[str, Any], None]:
    data = drop_keys(data, "relative_attention_num_buckets")
    size = data.get("embedding_size")
    size = None if size == data.get("hidden_size", 768) else size
    return {**data, "model_type": "bert", "embedding_size": size}, None


def bert_family(
    name: str,
    title: str,
    read_config: Callable[[dict[str, Any], str], tuple[dict[str, Any], Any]],
    rename: Callable[[dict[str, Tensor], Any], dict[str, Tensor]],
    **record: Any,
) -> Family:
    """The record of a family that runs on BERT's layers: BERT's key map, build and task-head
    prefixes, and BERT's capabilities unless ``record`` names others; ``record``: the
    :class:`~.registry.Family` fields of the family's own."""
    common = dict(key_map=bert_key_map, build=build_bert, head_prefixes=BERT_HEADS,
                  capabilities=BERT_CAPABILITIES)  # fmt: skip
    return Family(name, title, read_config, rename, **{**common, **record})


register(
    bert_family(
        "bert",
        "BERT",
        _read_bert,
        lambda s, c: s,
        pooler_expected=True,
        head_classes=task_classes("Bert", *CLASSIFIERS, "masked-lm"),
    )
)
for _name, _title, _stem in (("roberta", "RoBERTa", "Roberta"),
                             ("xlm-roberta", "XLM-RoBERTa", "XLMRoberta")):  # fmt: skip
    register(
        bert_family(
            _name,
            _title,
            _read_roberta,
            lambda s, c: offset_positions(s, c.position_offset, "roberta."),
            position_offset=roberta_offset,
            pooler_expected=True,
            # RoBERTa's classification head is BERT's: dense + tanh on <s>, then a linear layer
            head_classes=task_classes(_stem, *CLASSIFIERS),
        )
    )
register(
    bert_family(
        "electra",
        "ELECTRA",
        _read_electra,
        lambda s, c: _renamed_prefix(s, "electra."),
        first_token_layer=("pooler.dense.", "gelu"),  # its classifier.dense, as BERT's name
        head_classes=task_classes("Electra", *CLASSIFIERS),
    )
)
