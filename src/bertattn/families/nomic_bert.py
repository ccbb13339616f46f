"""NomicBERT (``model_type: nomic_bert``: nomic-embed-text-v1 / v1.5, as transformers' native
``NomicBertModel``): the post-norm rotary BERT of :mod:`.rotary_bert` with a SwiGLU
feed-forward (``silu(gate_proj(x)) * up_proj(x)``, then ``down_proj``), no bias in any linear
layer, rotary base 1,000 unless the config says otherwise, two token types.

The hub's own folders (nomic-embed-text-v1.5, for its remote code's ``NomicBertConfig``, a
GPT-2 config) name the sizes ``n_embd``, ``n_head``, ``n_layer``, ``n_inner``,
``n_positions``, ``layer_norm_epsilon``, the rotary base ``rotary_emb_base`` and the
feed-forward ``activation_function: swiglu``; :func:`from_remote_names` reads them, and
refuses the remote code's switches bertattn does not run (a partial or interleaved rotation,
a pre-norm or parallel block, biases) by their names."""

from __future__ import annotations

import json
import math
from typing import Any

from .registry import CLASSIFIERS, register, task_classes
from .rope import Refuse
from .rotary_bert import Variant, family

#: the remote code's field -> transformers' (read when transformers' own is absent)
REMOTE_NAMES = (
    ("n_embd", "hidden_size"),
    ("n_head", "num_attention_heads"),
    ("n_layer", "num_hidden_layers"),
    ("n_inner", "intermediate_size"),
    ("n_positions", "max_position_embeddings"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("rotary_emb_base", "rope_theta"),
    ("resid_pdrop", "hidden_dropout_prob"),
    ("attn_pdrop", "attention_probs_dropout_prob"),
)

#: the remote code's switches and the one value bertattn runs (checked when present)
REMOTE_FIXED = (
    ("rotary_emb_fraction", 1.0),
    ("rotary_emb_interleaved", False),
    ("rotary_emb_scale_base", None),
    ("rotary_scaling_factor", None),
    ("prenorm", False),
    ("parallel_block", False),
    ("causal", False),
    ("use_rms_norm", False),
    ("qkv_proj_bias", False),
    ("mlp_fc1_bias", False),
    ("mlp_fc2_bias", False),
)


def from_remote_names(data: dict[str, Any], refuse: Refuse) -> dict[str, Any]:
    """``data`` with the remote code's fields (:data:`REMOTE_NAMES`) under transformers'
    names: ``n_inner`` null is 4 x ``n_embd`` (GPT-2's rule), ``activation_function: swiglu``
    is the SiLU-gated feed-forward (``hidden_act: silu``), and the vocabulary is rounded up
    to ``pad_vocab_size_multiple`` (the word table's rows)."""
    out = dict(data)
    for theirs, ours in REMOTE_NAMES:
        if theirs in data and ours not in data and data[theirs] is not None:
            out[ours] = data[theirs]
    if "n_embd" in data and out.get("intermediate_size") is None and _is_int(out["hidden_size"]):
        out["intermediate_size"] = 4 * out["hidden_size"]
    for field_name, value in REMOTE_FIXED:
        if field_name in data and data[field_name] != value:
            raise refuse(field_name, data[field_name], f"{field_name}={json.dumps(value)}")
    act = data.get("activation_function")
    if act is not None and "hidden_act" not in data:
        if act != "swiglu":
            raise refuse("activation_function", act, "activation_function='swiglu'")
        out["hidden_act"] = "silu"
    multiple = data.get("pad_vocab_size_multiple", 1)
    vocab = out.get("vocab_size")
    if isinstance(multiple, int) and multiple > 1 and isinstance(vocab, int):
        out["vocab_size"] = math.ceil(vocab / multiple) * multiple
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: the checkpoint's names (its hub folders', as transformers saves them too) -> canonical
RENAMES = (
    (r"^encoder\.layers\.", "layers."),
    (r"^emb_ln\.", "embeddings.LayerNorm."),
    (r"\.attn\.Wqkv\.", ".self_attn.qkv."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.fc11\.", ".mlp.up_proj."),
    (r"\.mlp\.fc12\.", ".mlp.gate_proj."),
    (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."),
    (r"\.norm2\.", ".post_mlp_layernorm."),
)

NOMIC_BERT = Variant(
    name="nomic_bert",
    title="NomicBERT",
    prefix="nomic_bert.",
    default_theta=1_000.0,
    renames=RENAMES,
    default_act="silu",
    translate=from_remote_names,
)

# the pooler (dense + tanh) then a linear layer, BERT's head
_TASKS = task_classes("NomicBert", *CLASSIFIERS)
register(family(NOMIC_BERT, ("classifier.", "cls."), head_classes=_TASKS))
