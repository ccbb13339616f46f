"""DistilBERT (``model_type: distilbert``): a BERT without token types and without a pooler,
the same post-LayerNorm layers under other names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``,
...). Its token-type embedding is supplied as zeros (two rows, so that a text pair's second
segment adds nothing either), which leaves every hidden state as DistilBERT computes it. Its
sinusoidal position embeddings (``sinusoidal_pos_embds: true``) are refused."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from ..errors import ModelFolderError
from .bert import bert_family
from .registry import CLASSIFIERS, register, task_classes
from .renaming import renamed_layers

__all__ = ["DISTIL_KEY"]

_CONFIG = {
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
_LAYER = {
    "attention.q_lin": "attention.self.query",
    "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value",
    "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm",
    "ffn.lin1": "intermediate.dense",
    "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}
#: a DistilBERT layer tensor (groups: prefix, layer index, part, weight / bias)
DISTIL_KEY = re.compile(r"^(distilbert\.)?transformer\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def _read(data: dict[str, Any], source: str) -> tuple[dict[str, Any], None]:
    if data.get("sinusoidal_pos_embds"):
        raise ModelFolderError(
            f"{source}: sinusoidal_pos_embds=true is not supported; bertattn loads DistilBERT "
            f"checkpoints with learned position embeddings (sinusoidal_pos_embds false)."
        )
    out: dict[str, Any] = {"model_type": "bert", "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    for theirs, ours in _CONFIG.items():
        if theirs in data:
            out[ours] = data[theirs]
    return out, None


def _rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    return renamed_layers(state, "DistilBERT", "distilbert.", DISTIL_KEY, _LAYER)


register(
    bert_family(
        "distilbert",
        "DistilBERT",
        _read,
        _rename,
        first_token_layer=("pre_classifier.", "relu"),
        head_classes=task_classes("DistilBert", *CLASSIFIERS),
    )
)
