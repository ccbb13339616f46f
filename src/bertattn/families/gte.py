"""GTE (``model_type: gte``: gte-base-en-v1.5, gte-multilingual-base, as transformers' native
``GteModel``; ``model_type: new``: the same folders as the hub keeps them, for the remote-code
``NewModel``; snowflake-arctic-embed-m-v2.0 declares ``gte`` with ``NewConfig``'s fields and
``NewModel``'s tensors, read the same way): the post-norm rotary BERT of :mod:`.rotary_bert`
with a gated feed-forward (``act(gate_proj(x)) * up_proj(x)``, then ``down_proj`` with a
bias), biased attention projections, rotary base 160,000 unless the config says otherwise,
and token types when ``type_vocab_size`` is not 0."""

from __future__ import annotations

from .registry import CLASSIFIERS, register, task_classes
from .rotary_bert import Variant, family

#: the checkpoint's names (its hub folders', as transformers saves them too) -> canonical
RENAMES = (
    (r"^encoder\.layer\.", "layers."),
    (r"\.attention\.qkv_proj\.", ".self_attn.qkv."),
    (r"\.attention\.o_proj\.", ".self_attn.o_proj."),
    (r"\.attention\.([qkv])_proj\.", r".self_attn.\1_proj."),  # NewModel's pack_qkv false
    (r"\.attn_ln\.", ".post_attention_layernorm."),
    (r"\.mlp_ln\.", ".post_mlp_layernorm."),
    (r"\.mlp\.up_gate_proj\.", ".mlp.up_gate."),
)

GTE = Variant(
    name="gte",
    title="GTE",
    prefix="gte.",
    other_prefixes=("new.",),
    attention_bias=True,
    mlp_out_bias=True,
    default_theta=160_000.0,
    renames=RENAMES,
    default_act="gelu",
    # NewConfig's switches for what GTE's released folders do not use
    fixed=(
        ("position_embedding_type", "rope"),
        ("layer_norm_type", "layer_norm"),
        ("logn_attention_scale", False),
    ),
    alias_theta=(("new", 10_000.0),),  # NewConfig's rope_theta default
    ntk=True,  # gte-base-en-v1.5's rope_scaling {"type": "ntk", "factor": 2.0}
)

# the pooler (dense + tanh) then a linear layer, BERT's head
_TASKS = task_classes("Gte", *CLASSIFIERS)
register(family(GTE, ("classifier.", "lm_head.", "cls."), head_classes=_TASKS), "new")
