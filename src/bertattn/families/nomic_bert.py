"""NomicBERT (``model_type: nomic_bert``: nomic-embed-text-v1 / v1.5, as transformers' native
``NomicBertModel``): the post-norm rotary BERT of :mod:`.rotary_bert` with a SwiGLU
feed-forward (``silu(gate_proj(x)) * up_proj(x)``, then ``down_proj``), no bias in any linear
layer, rotary base 1,000 unless the config says otherwise, two token types."""

from __future__ import annotations

from .registry import register
from .rotary_bert import Variant, family

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
    gated=True,
    attention_bias=False,
    mlp_in_bias=False,
    mlp_out_bias=False,
    default_theta=1_000.0,
    renames=RENAMES,
    default_act="silu",
)

register(family(NOMIC_BERT, ("classifier.", "cls.")))
