"""MPNet (``model_type: mpnet``): BERT's post-LayerNorm layers under other names
(``attention.attn.q``, ``attention.attn.o``, ``attention.LayerNorm``, ...) plus a relative
position bias: one ``encoder.relative_attention_bias`` table (buckets x heads), shared by every
layer and added to every layer's scaled scores (:mod:`bertattn.blocks.relative`). Its positions
start past its padding index, which transformers fixes at 1 whatever ``pad_token_id`` says: the
table's first two rows are dropped, as RoBERTa's are. It has no token types: a zero token-type
embedding is supplied, as for DistilBERT. A ``relative_attention_num_buckets`` below the 32
buckets transformers computes is refused (transformers itself would index past the table)."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from ..blocks.relative import NUM_BUCKETS
from ..errors import ModelFolderError
from .bert import (
    BERT_CAPABILITIES,
    bert_family,
    drop_keys,
    offset_config,
    roberta_head_name,
)
from .registry import register, task_classes
from .renaming import renamed_layers

#: MPNet's padding index: transformers' ``MPNetEmbeddings`` fixes it at 1 (not the config's)
_PADDING_IDX = 1
_LAYER = {
    "attention.attn.q": "attention.self.query",
    "attention.attn.k": "attention.self.key",
    "attention.attn.v": "attention.self.value",
    "attention.attn.o": "attention.output.dense",
    "attention.LayerNorm": "attention.output.LayerNorm",
    "intermediate.dense": "intermediate.dense",
    "output.dense": "output.dense",
    "output.LayerNorm": "output.LayerNorm",
}
_KEY = re.compile(r"^(mpnet\.)?encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def _offset(data: dict[str, Any]) -> int:
    return _PADDING_IDX + 1


def _read(data: dict[str, Any], source: str) -> tuple[dict[str, Any], None]:
    """Checked for what bertattn reproduces: a bias table of at least the 32 buckets
    transformers computes (its ``compute_position_bias`` ignores the setting)."""
    buckets = data.get("relative_attention_num_buckets", NUM_BUCKETS)
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < NUM_BUCKETS:
        raise ModelFolderError(
            f"{source}: relative_attention_num_buckets={buckets!r} is not supported; "
            f"transformers' MPNet computes {NUM_BUCKETS} relative position buckets whatever "
            f"this says, so bertattn loads MPNet checkpoints with relative_attention_num_buckets "
            f">= {NUM_BUCKETS} (the released ones have {NUM_BUCKETS})."
        )
    data = {**drop_keys(data, "embedding_size"), "relative_attention_num_buckets": buckets}
    return offset_config(data, _offset(data)), None


def _rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """``mpnet.`` as ``bert.``, the layers' names as BERT's, the position table without its
    first rows, a zero token-type embedding, ``encoder.relative_attention_bias`` kept, a
    classification head as BERT's pooler and classifier (MPNet's head is RoBERTa's)."""
    prefixed = any(k.startswith("mpnet.") for k in state)
    offset = config.position_offset

    def other(name: str, tensor: Tensor) -> tuple[str, Tensor]:
        name = roberta_head_name(name, prefixed)
        if name.endswith("embeddings.position_embeddings.weight"):
            tensor = tensor[offset:]
        return name, tensor

    return renamed_layers(state, "MPNet", "mpnet.", _KEY, _LAYER, other)


register(
    bert_family(
        "mpnet",
        "MPNet",
        _read,
        _rename,
        position_offset=_offset,
        pooler_expected=True,
        # RoBERTa's sequence-classification head (dense + tanh on <s>, then a linear layer)
        head_classes=task_classes("MPNet", "sequence-classification"),
        needs_tokenizer_json=True,
        # the page's steps view recomputes q, k, v and has no step for the relative bias
        # and compile=True is tested on BERT's absolute positions only
        capabilities=BERT_CAPABILITIES - {"steps", "compile"},
        missing={
            "steps": "MPNet's relative position bias",
            "compile": "MPNet's relative position bias (not yet checked compiled)",
        },
    )
)
