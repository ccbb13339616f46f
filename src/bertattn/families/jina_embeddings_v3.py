"""Jina embeddings v3 (``model_type: jina_embeddings_v3``, as transformers' native
``JinaEmbeddingsV3Model``): XLM-RoBERTa's layers with rotary positions instead of its position
table, the post-norm rotary BERT of :mod:`.rotary_bert` with the plain feed-forward (``fc1``,
``fc2``), biased projections, rotary base 20,000 unless the config says otherwise, one token
type and XLM-RoBERTa's pooler under ``roberta.``.

The released folder (``jinaai/jina-embeddings-v3``, remote code
``jinaai/xlm-roberta-flash-implementation``) declares ``"model_type": "xlm-roberta"`` with
that code in its ``auto_map`` and ``XLMRobertaLoRA`` as its architecture; this record reads
it too: ``rotary_emb_base`` is the rotation's base, the tensors keep the remote code's names
(``emb_ln``, ``mixer.Wqkv``, ``norm1``, ...) and every linear layer and embedding table
carries one LoRA update per task of ``lora_adaptations`` (:mod:`.lora`). ``task=`` at load
merges one task's updates into the weights; no task loads the base weights, as the remote
code runs without one. transformers' native class has no adapters."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any

from torch import Tensor

from ..errors import UsageError
from .config_fields import refuse as refusal
from .lora import LoraTasks, merge, read_lora
from .registry import register
from .rope import Refuse, rope_theta
from .rotary_bert import RotaryArch, Variant, family
from .rotary_bert import read_config as rotary_config
from .rotary_bert import rename as rotary_rename

#: the remote code of the released folder (its ``auto_map`` targets start with it)
REMOTE_CODE = "jinaai/xlm-roberta-flash-implementation--"

#: the checkpoint's names (its hub folders', as transformers saves them too) -> canonical
RENAMES = (
    (r"^encoder\.layers\.", "layers."),
    (r"^emb_ln\.", "embeddings.LayerNorm."),
    (r"\.mixer\.Wqkv\.", ".self_attn.qkv."),
    (r"\.mixer\.out_proj\.", ".self_attn.o_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."),
    (r"\.norm2\.", ".post_mlp_layernorm."),
)


def is_hub_folder(data: dict[str, Any]) -> bool:
    """Whether an ``xlm-roberta`` config.json is Jina v3's released one: its ``auto_map``
    points at the LoRA remote code (or a local copy of it), or its architecture is
    ``XLMRobertaLoRA``."""
    auto = data.get("auto_map")
    targets = [t for t in auto.values() if isinstance(t, str)] if isinstance(auto, dict) else []
    archs = data.get("architectures")
    return any(t.startswith(REMOTE_CODE) or "modeling_lora." in t for t in targets) or (
        isinstance(archs, list) and "XLMRobertaLoRA" in archs
    )


def from_remote_names(data: dict[str, Any], refuse: Refuse) -> dict[str, Any]:
    """The released config under the native names: ``rotary_emb_base`` as ``rope_theta``;
    ``position_embedding_type`` other than ``rotary`` refused (the native config has
    neither)."""
    if data.get("model_type") != "xlm-roberta":
        return data
    out = dict(data)
    kind = out.pop("position_embedding_type", "rotary")
    if kind != "rotary":
        raise refuse("position_embedding_type", kind, "position_embedding_type='rotary'")
    if "rotary_emb_base" in out and "rope_theta" not in out:
        out["rope_theta"] = rope_theta(out.pop("rotary_emb_base"), "rotary_emb_base", refuse)
    return out


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
    translate=from_remote_names,
)


@dataclass(frozen=True)
class JinaArch(RotaryArch):
    """The rotary settings and the folder's task adapters (None: the native folder's none)."""

    lora: LoraTasks | None = None


def read_config(data: dict[str, Any], source: str) -> tuple[dict[str, Any], JinaArch]:
    """Either config.json (native or released) -> BERT's sizes and :class:`JinaArch`."""
    sizes, arch = rotary_config(JINA_V3, data, source)
    lora = None
    if "lora_adaptations" in data:
        lora = read_lora(data, partial(refusal, source, JINA_V3.title))
    values = {f.name: getattr(arch, f.name) for f in fields(RotaryArch)}
    return sizes, JinaArch(**values, lora=lora)


def rename(state: dict[str, Tensor], config: Any) -> dict[str, Tensor]:
    """The released folder's adapters merged for the chosen task (:func:`.lora.merge`), then
    the rotary family's renaming."""
    lora = getattr(config.arch, "lora", None)
    if lora is not None:
        state = merge(state, lora, "the checkpoint")
    return rotary_rename(state, config)


def choose_task(arch: JinaArch, task: str | None, source: str) -> JinaArch:
    """``arch`` with ``task``'s adapter chosen; a task for a folder without adapters refused."""
    if arch.lora is None:
        if task is None:
            return arch
        raise UsageError(
            f"task={task!r}: {source} has no task adapters (no lora_adaptations in its "
            f"config.json; jinaai/jina-embeddings-v3's own folder has them); load it without "
            f"task=."
        )
    return replace(arch, lora=arch.lora.choose(task, source))


def task_names(arch: JinaArch) -> tuple[str, ...]:
    """The folder's task adapters (none for the native folder)."""
    return () if arch.lora is None else arch.lora.tasks


register(
    replace(
        family(
            JINA_V3,
            ("classifier.", "lm_head.", "qa_outputs."),
            pooler_expected=True,
            claims=(("xlm-roberta", is_hub_folder),),
            choose_task=choose_task,
            task_names=task_names,
        ),
        read_config=read_config,
        rename=rename,
    )
)
