"""Loading an encoder for a head: the folder's ``config.json`` must name the head's
architecture, and the encoder loads without the warnings about the head tensors it leaves
(the head reads those itself)."""

from __future__ import annotations

import warnings
from typing import Any

from ..encoder import Bert, ModelFolder
from ..errors import ModelFolderError
from ..families import registry as families
from .config import HeadConfig, read_head_config
from .registry import HeadKind

__all__ = ["load_encoder"]

#: what each head kind is for, in the refusal
_USES = {
    "sequence-classification": "a reranker or classifier",
    "token-classification": "a tagger",
    "masked-lm": "fill-mask or SPLADE",
}


def load_encoder(
    folder: ModelFolder, kind: HeadKind, who: str, **load: Any
) -> tuple[Bert, HeadConfig]:
    """The :class:`Bert` of ``folder`` and its :class:`HeadConfig`, which must be the head
    ``kind`` reads (``who``: the class or task asking, for the message); ``load``:
    :meth:`Bert.load`'s keywords (``dtype``, ``backend``, ``device``, ``threads``)."""
    head = read_head_config(folder.model_dir, folder.root)
    if not kind.reads(head):
        arch = next(a for a, k in families.head_classes().items() if k == kind.head)
        raise ModelFolderError(
            f"{folder.config_path}: architectures is {head.architecture or 'not given'}; "
            f"{who} needs a {arch} checkpoint ({_USES[kind.head]}). For sentence embeddings "
            f"load it with bertattn.Bert."
        )
    with warnings.catch_warnings():  # the head's tensors are read by the head
        warnings.filterwarnings("ignore", message=r".*skipped \d+ task-head tensors")
        if not kind.uses_pooler:  # these heads run without the pooler
            warnings.filterwarnings("ignore", message=r".*no pooler weights")
        bert = Bert.load(folder, **load)
    return bert, head
