"""Jina embeddings v3 (``model_type: jina_embeddings_v3``, as transformers' native
``JinaEmbeddingsV3Model``): XLM-RoBERTa's layers with rotary positions instead of its position
table, the post-norm rotary BERT of :mod:`.rotary_bert` with the plain feed-forward (``fc1``,
``fc2``), biased projections, rotary base 20,000 unless the config says otherwise, one token
type and XLM-RoBERTa's pooler under ``roberta.``.

The released checkpoint (``jinaai/jina-embeddings-v3``, custom code) carries per-task LoRA
adapters chosen with ``task=``; transformers' native class has none (it is the base model with
the adapters not applied, or merged by whoever converted the folder), and bertattn matches the
native class: a folder with adapter tensors is refused by their names (unexpected keys)."""

from __future__ import annotations

from .registry import register
from .rotary_bert import Variant, family

#: the checkpoint's names (its hub folders', as transformers saves them too) -> canonical
RENAMES = (
    (r"^encoder\.layers\.", "layers."),
    (r"^emb_ln\.", "embeddings.LayerNorm."),
    (r"\.mixer\.Wqkv\.", ".self_attn.qkv."),
    (r"\.mixer\.out_proj\.", ".self_attn.o_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."),
    (r"\.norm2\.", ".post_mlp_layernorm."),
)

JINA_V3 = Variant(
    name="jina_embeddings_v3",
    title="Jina embeddings v3",
    prefix="roberta.",
    gated=False,
    attention_bias=True,
    mlp_in_bias=True,
    mlp_out_bias=True,
    default_theta=20_000.0,
    renames=RENAMES,
    default_act="gelu",
)

register(family(JINA_V3, ("classifier.", "lm_head.", "qa_outputs."), pooler_expected=True))
