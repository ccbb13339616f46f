"""Renaming a family's per-layer tensors to BERT's, for the families whose layers are BERT's
post-LayerNorm layers under names of their own (DistilBERT, MPNet)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import ModelFolderError

__all__ = ["renamed_layers"]


def renamed_layers(
    state: dict[str, Tensor],
    what: str,
    prefix: str,
    layer_key: re.Pattern[str],
    layer_names: dict[str, str],
    other: Callable[[str, Tensor], tuple[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``state`` under BERT's names: a layer tensor matched by ``layer_key`` (groups: prefix,
    layer index, part, weight / bias) is renamed by ``layer_names`` (another part is an error
    naming the tensor); any other has the family's ``prefix`` (``distilbert.``) replaced by
    ``bert.``, then goes through ``other`` when given; then a zero token-type embedding of two
    rows is added (the family has no token types: a pair's second segment adds nothing
    either)."""
    top = "bert." if any(k.startswith(prefix) for k in state) else ""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        m = layer_key.match(key)
        if m:
            part = layer_names.get(m.group(3))
            if part is None:
                raise ModelFolderError(f"unexpected {what} tensor {key}.")
            out[f"{top}encoder.layer.{m.group(2)}.{part}.{m.group(4)}"] = tensor
            continue
        name = "bert." + key[len(prefix) :] if key.startswith(prefix) else key
        name, value = (name, tensor) if other is None else other(name, tensor)
        out[name] = value
    words = out.get(f"{top}embeddings.word_embeddings.weight")
    if words is not None:
        out[f"{top}embeddings.token_type_embeddings.weight"] = torch.zeros(
            2, words.shape[1], dtype=words.dtype
        )
    return out
