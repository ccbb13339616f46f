"""BERT's close family, loaded into the same encoder: a checkpoint of another ``model_type`` is
read as the BERT it is equivalent to — its config as a :class:`~.config.BertConfig`, its tensor
names as BERT's — and anything that is not equivalent is refused by name.

DistilBERT (``model_type: distilbert``) is a BERT without token types and without a pooler:
the same post-LayerNorm layers under other names (``q_lin``, ``sa_layer_norm``, ``ffn.lin1``,
...). Its token-type embedding is supplied as zeros (two rows, so that a text pair's second
segment adds nothing either), which leaves every hidden state as DistilBERT computes it. Its
sinusoidal position embeddings (``sinusoidal_pos_embds: true``) are refused; checkpoints that
use them still carry learned-size tables, but bertattn does not claim them.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from ..errors import ModelFolderError

__all__ = ["FAMILIES", "as_bert_config", "as_bert_names", "family_of"]

#: the ``model_type`` values bertattn loads (None: a config without one, read as BERT)
FAMILIES = ("bert", "distilbert")

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


def as_bert_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A family member's ``config.json`` as BERT's (BERT's own: unchanged)."""
    if data.get("model_type") != "distilbert":
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


def family_of(state: dict[str, Tensor]) -> str:
    """``"distilbert"`` when the tensors are named as DistilBERT's, else ``"bert"``."""
    return "distilbert" if any(_DISTIL_KEY.match(k) for k in state) else "bert"


def as_bert_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A family member's tensors under BERT's names (BERT's own: unchanged); DistilBERT gets a
    zero token-type embedding (see the module docstring). Head tensors keep their names."""
    if family_of(state) != "distilbert":
        return state
    prefixed = any(k.startswith("distilbert.") for k in state)
    top = "bert." if prefixed else ""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        m = _DISTIL_KEY.match(key)
        if m:
            part = _DISTIL_LAYER.get(m.group(3))
            if part is None:
                raise ModelFolderError(f"unexpected DistilBERT tensor {key}.")
            out[f"{top}encoder.layer.{m.group(2)}.{part}.{m.group(4)}"] = tensor
        elif key.startswith("distilbert."):
            out["bert." + key[len("distilbert.") :]] = tensor
        else:
            out[key] = tensor
    words = out.get(f"{top}embeddings.word_embeddings.weight")
    if words is not None:
        out[f"{top}embeddings.token_type_embeddings.weight"] = torch.zeros(
            2, words.shape[1], dtype=words.dtype
        )
    return out
