"""BERT's close family, loaded into the same encoder: a checkpoint of another ``model_type``
is read as the BERT it is equivalent to — its config as a :class:`~.config.BertConfig`, its
tensor names as BERT's — and anything that is not equivalent is refused by name.

DistilBERT (``model_type: distilbert``) is a BERT without token types and without a pooler:
the same post-LayerNorm layers under other names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``,
...). Its token-type embedding is supplied as zeros (two rows, so that a text pair's second
segment adds nothing either), which leaves every hidden state as DistilBERT computes it. Its
sinusoidal position embeddings (``sinusoidal_pos_embds: true``) are refused.

RoBERTa and XLM-RoBERTa (``roberta``, ``xlm-roberta``) are BERT's layers under BERT's names
(``roberta.`` for ``bert.``); their positions are numbered from ``pad_token_id + 1``, so the
position table's first rows are never used by a right-padded input: they are dropped and the
encoder numbers positions from 0, as BERT does — the same vectors. Their one token type is
given to both segments of a pair. Their tokenizers (byte-level BPE, SentencePiece) come from
the folder's ``tokenizer.json``.

ELECTRA (``electra``: the discriminator's encoder) is BERT's layers under ``electra.``, without
a pooler; when its ``embedding_size`` differs from ``hidden_size`` (ELECTRA-small), the
embeddings are that narrow and its ``embeddings_project`` (a linear layer to the hidden size)
follows them (``BertEmbeddings.project``).

MPNet (``mpnet``) is BERT's post-LayerNorm layers under other names (``attention.attn.q``,
``attention.attn.o``, ``attention.LayerNorm``, ...) plus a relative position bias: one
``encoder.relative_attention_bias`` table (buckets x heads), shared by every layer and added to
every layer's scaled scores (:mod:`.relative`). Its positions start past its padding index,
which transformers fixes at 1 whatever ``pad_token_id`` says: the table's first two rows are
dropped, as RoBERTa's are. It has no token types: a zero token-type embedding is supplied, as
for DistilBERT. A ``relative_attention_num_buckets`` below the 32 buckets transformers computes
is refused (transformers itself would index past the table).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import ModelFolderError

__all__ = ["FAMILIES", "as_bert_config", "as_bert_names", "family_of", "position_offset"]

#: the ``model_type`` values bertattn loads (None: a config without one, read as BERT)
FAMILIES = ("bert", "distilbert", "electra", "mpnet", "roberta", "xlm-roberta")
#: families whose position ids start past the padding id (RoBERTa's ``padding_idx + 1``)
_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "mpnet")
#: MPNet's padding index: transformers' ``MPNetEmbeddings`` fixes it at 1 (not the config's)
_MPNET_PADDING_IDX = 1

_DISTIL_CONFIG = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "hidden_dim": "intermediate_size",
    "activation": "hidden_act",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "pad_token_id": "pad_token_id",
}
_DISTIL_LAYER = {
    "attention.q_lin": "attention.self.query",
    "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value",
    "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm",
    "ffn.lin1": "intermediate.dense",
    "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}
_DISTIL_KEY = re.compile(r"^(distilbert\.)?transformer\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_MPNET_LAYER = {
    "attention.attn.q": "attention.self.query",
    "attention.attn.k": "attention.self.key",
    "attention.attn.v": "attention.self.value",
    "attention.attn.o": "attention.output.dense",
    "attention.LayerNorm": "attention.output.LayerNorm",
    "intermediate.dense": "intermediate.dense",
    "output.dense": "output.dense",
    "output.LayerNorm": "output.LayerNorm",
}
_MPNET_KEY = re.compile(r"^(mpnet\.)?encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def position_offset(data: dict[str, Any]) -> int:
    """Rows of the position table before the first real position: RoBERTa and XLM-RoBERTa
    number positions from ``pad_token_id + 1`` (2 for their checkpoints); BERT from 0."""
    kind = data.get("model_type")
    if kind not in _OFFSET_POSITIONS:
        return 0
    if kind == "mpnet":
        return _MPNET_PADDING_IDX + 1
    return int(data.get("pad_token_id", 1)) + 1


def as_bert_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A family member's ``config.json`` as BERT's (BERT's own: unchanged). RoBERTa and
    XLM-RoBERTa: BERT's layers and names; their positions start past the padding id, so the
    table's first ``pad_token_id + 1`` rows are never used and are dropped (see
    :func:`as_bert_names`), and their one token type is given to both segments."""
    kind = data.get("model_type")
    if kind != "electra":  # only ELECTRA's embeddings may be narrower than its encoder
        data = {k: v for k, v in data.items() if k != "embedding_size"}
    if kind != "mpnet":  # only MPNet's encoder holds a relative position bias table
        data = {k: v for k, v in data.items() if k != "relative_attention_num_buckets"}
    else:
        data = _mpnet_config(data, source)
    if kind in _OFFSET_POSITIONS:
        offset = position_offset(data)
        out = {**data, "model_type": "bert", "type_vocab_size": 2}
        if "max_position_embeddings" in data:
            out["max_position_embeddings"] = int(data["max_position_embeddings"]) - offset
        return out
    if kind == "electra":  # embedding_size: a projection when it is not the hidden size
        size = data.get("embedding_size")
        size = None if size == data.get("hidden_size", 768) else size
        return {**data, "model_type": "bert", "embedding_size": size}
    if kind != "distilbert":
        return data
    if data.get("sinusoidal_pos_embds"):
        raise ModelFolderError(
            f"{source}: sinusoidal_pos_embds=true is not supported; bertattn loads DistilBERT "
            f"checkpoints with learned position embeddings (sinusoidal_pos_embds false)."
        )
    out: dict[str, Any] = {"model_type": "bert", "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    for theirs, ours in _DISTIL_CONFIG.items():
        if theirs in data:
            out[ours] = data[theirs]
    return out


def _mpnet_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """MPNet's ``config.json`` checked for what bertattn reproduces: a bias table of at least
    the 32 buckets transformers computes (its ``compute_position_bias`` ignores the setting)."""
    from .relative import NUM_BUCKETS

    buckets = data.get("relative_attention_num_buckets", NUM_BUCKETS)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < NUM_BUCKETS:
        raise ModelFolderError(
            f"{source}: relative_attention_num_buckets={buckets!r} is not supported; "
            f"transformers' MPNet computes {NUM_BUCKETS} relative position buckets whatever "
            f"this says, so bertattn loads MPNet checkpoints with relative_attention_num_buckets "
            f">= {NUM_BUCKETS} (the released ones have {NUM_BUCKETS})."
        )
    return {**data, "relative_attention_num_buckets": buckets}


def family_of(state: dict[str, Tensor]) -> str:
    """``"distilbert"`` when the tensors are named as DistilBERT's, else ``"bert"``."""
    return "distilbert" if any(_DISTIL_KEY.match(k) for k in state) else "bert"


def roberta_head_name(key: str, prefixed: bool) -> str:
    """A RoBERTa sequence-classification head's tensor under BERT's names: its
    ``classifier.dense`` (dense + tanh on the first token) is BERT's pooler, its
    ``classifier.out_proj`` BERT's classifier."""
    if key.startswith("classifier.dense."):
        return ("bert." if prefixed else "") + "pooler.dense." + key.split(".", 2)[2]
    if key.startswith("classifier.out_proj."):
        return "classifier." + key.split(".", 2)[2]
    return key


def _offset_positions(state: dict[str, Tensor], offset: int) -> dict[str, Tensor]:
    """RoBERTa's tensors under BERT's names: ``roberta.`` as ``bert.``, the position table
    without its first ``offset`` rows, the one token type repeated for the second segment, a
    classification head as BERT's pooler and classifier (:func:`roberta_head_name`)."""
    prefixed = any(k.startswith("roberta.") for k in state)
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        name = "bert." + key.split(".", 1)[1] if key.startswith("roberta.") else key
        name = roberta_head_name(name, prefixed)
        if name.endswith("embeddings.position_embeddings.weight"):
            tensor = tensor[offset:]
        elif name.endswith("embeddings.token_type_embeddings.weight") and tensor.shape[0] == 1:
            tensor = tensor.expand(2, -1).clone()
        out[name] = tensor
    return out


def _mpnet_names(state: dict[str, Tensor], offset: int) -> dict[str, Tensor]:
    """MPNet's tensors under BERT's names: ``mpnet.`` as ``bert.``, its layers' names as BERT's
    (``attention.attn.q`` as ``attention.self.query``, ...), the position table without its
    first ``offset`` rows, a zero token-type embedding (two rows: a pair's second segment adds
    nothing either), ``encoder.relative_attention_bias`` kept, a classification head as BERT's
    pooler and classifier (:func:`roberta_head_name`: MPNet's head is RoBERTa's)."""
    prefixed = any(k.startswith("mpnet.") for k in state)

    def other(name: str, tensor: Tensor) -> tuple[str, Tensor]:
        name = "bert." + name[len("mpnet.") :] if name.startswith("mpnet.") else name
        name = roberta_head_name(name, prefixed)
        if name.endswith("embeddings.position_embeddings.weight"):
            tensor = tensor[offset:]
        return name, tensor

    return _renamed(state, "MPNet", _MPNET_KEY, _MPNET_LAYER, prefixed, other)


def _renamed(
    state: dict[str, Tensor],
    what: str,
    layer_key: re.Pattern[str],
    layer_names: dict[str, str],
    prefixed: bool,
    other: Callable[[str, Tensor], tuple[str, Tensor]],
) -> dict[str, Tensor]:
    """``state`` under BERT's names, for a family whose layers have names of their own
    (DistilBERT, MPNet): a layer tensor matched by ``layer_key`` (groups: prefix, layer index,
    part, weight / bias) is renamed by ``layer_names`` (another part is an error naming the
    tensor), any other by ``other``; then a zero token-type embedding of two rows is added (the
    family has no token types: a pair's second segment adds nothing either)."""
    top = "bert." if prefixed else ""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        m = layer_key.match(key)
        if m:
            part = layer_names.get(m.group(3))
            if part is None:
                raise ModelFolderError(f"unexpected {what} tensor {key}.")
            out[f"{top}encoder.layer.{m.group(2)}.{part}.{m.group(4)}"] = tensor
        else:
            name, value = other(key, tensor)
            out[name] = value
    words = out.get(f"{top}embeddings.word_embeddings.weight")
    if words is not None:
        out[f"{top}embeddings.token_type_embeddings.weight"] = torch.zeros(
            2, words.shape[1], dtype=words.dtype
        )
    return out


def as_bert_names(
    state: dict[str, Tensor], offset: int = 0, family: str = "bert"
) -> dict[str, Tensor]:
    """A family member's tensors under BERT's names (BERT's own: unchanged); DistilBERT and
    MPNet get a zero token-type embedding (see the module docstring); ``offset`` (RoBERTa's
    :func:`position_offset`): the position rows before the first real position, dropped;
    ``family``: the checkpoint's ``model_type`` (needed for MPNet, whose layer names are also
    ``encoder.layer.N``). Head tensors keep their names."""
    if family == "mpnet":
        return _mpnet_names(state, offset)
    if offset:
        return _offset_positions(state, offset)
    if any(k.startswith("electra.") for k in state):  # ELECTRA: BERT's names under electra.
        return {("bert." + k.split(".", 1)[1] if k.startswith("electra.") else k): v
                for k, v in state.items()}  # fmt: skip
    if family_of(state) != "distilbert":
        return state
    prefixed = any(k.startswith("distilbert.") for k in state)

    def other(name: str, tensor: Tensor) -> tuple[str, Tensor]:
        if name.startswith("distilbert."):
            return "bert." + name[len("distilbert.") :], tensor
        return name, tensor

    return _renamed(state, "DistilBERT", _DISTIL_KEY, _DISTIL_LAYER, prefixed, other)
