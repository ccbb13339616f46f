"""Task adapters kept beside the weights they change, as Jina v3's hub folder keeps them: every
adapted layer stores its base weight and one low-rank update per task, and ``task=`` chooses
one update for every layer (none: the base weights).

In the checkpoint (torch's parametrization names), for an adapted layer ``L``:

* ``L.parametrizations.weight.original``: the base weight ``W``;
* a linear layer (``W``: ``(out, in)``): ``L.parametrizations.weight.0.lora_A``
  ``(T, r, in)`` and ``lora_B`` ``(T, out, r)``; task ``t`` runs ``W + s * B[t] @ A[t]``;
* an embedding table (``W``: ``(rows, width)``, a name ending in ``_embeddings``): ``lora_A``
  ``(T, rows, r)`` and ``lora_B`` ``(T, r, width)``; task ``t`` runs ``W + s * A[t] @ B[t]``;

with ``T`` the config's ``lora_adaptations`` (task names, in the order of the first axis),
``r`` its ``lora_rank`` and ``s = lora_alpha / lora_rank``. The remote code chooses the update
per row of a batch; one task for the whole model is the same update merged into ``W`` once, at
load (:func:`merge`). Dropout on the adapters (``lora_dropout_p``) is training-only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ..errors import ModelFolderError, UsageError
from .rope import Refuse

__all__ = ["LoraTasks", "merge", "read_lora"]

#: the name of a base weight kept beside its adapters, and of the adapters, after the layer's
ORIGINAL = ".parametrizations.weight.original"
ADAPTER = ".parametrizations.weight.0.lora_"


@dataclass(frozen=True)
class LoraTasks:
    """A folder's task adapters: their names (``lora_adaptations``), rank, ``lora_alpha``, and
    the task chosen for this model (None: the base weights)."""

    tasks: tuple[str, ...]
    rank: int
    alpha: float
    task: str | None = None

    @property
    def scale(self) -> float:
        """``alpha / rank``, the factor of every update."""
        return self.alpha / self.rank

    def choose(self, task: str | None, source: str) -> LoraTasks:
        """These adapters with ``task`` chosen; one the folder does not have: ValueError
        naming the ones it has (a UsageError: the fix is another task)."""
        if task is not None and task not in self.tasks:
            raise UsageError(
                f"task={task!r} is not one of the task adapters of {source}: "
                f"{', '.join(self.tasks)}; pass one of them, or no task for the base weights."
            )
        return replace(self, task=task)


def read_lora(data: dict[str, Any], refuse: Refuse) -> LoraTasks:
    """``lora_adaptations`` (a non-empty list of distinct names), ``lora_rank`` (an int >= 1)
    and ``lora_alpha`` (a number > 0) of ``config.json``, refused by field name."""
    names = data.get("lora_adaptations")
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise refuse("lora_adaptations", names, "a non-empty list of distinct task names")
    rank = data.get("lora_rank", 4)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise refuse("lora_rank", rank, "an int >= 1")
    alpha = data.get("lora_alpha", 1)
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not math.isfinite(alpha)
        or alpha <= 0
    ):
        raise refuse("lora_alpha", alpha, "a finite number > 0")
    return LoraTasks(tuple(names), rank, float(alpha))


def merge(state: dict[str, Tensor], lora: LoraTasks, source: str) -> dict[str, Tensor]:
    """``state`` with each adapted layer's ``original`` weight under ``L.weight``, its chosen
    task's update added (float32 at least), and the adapter tensors dropped. An adapter without
    its base weight, a base weight without both adapters, or shapes other than the module
    docstring's: ModelFolderError naming the tensor."""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if ADAPTER in key:
            layer = key.split(ADAPTER)[0]
            if layer + ORIGINAL not in state:
                raise ModelFolderError(f"{source}: {key} has no base weight {layer}{ORIGINAL}.")
            continue
        if key.endswith(ORIGINAL):
            layer = key[: -len(ORIGINAL)]
            out[f"{layer}.weight"] = _merged(layer, tensor, state, lora, source)
        else:
            out[key] = tensor
    return out


def _merged(
    layer: str, weight: Tensor, state: dict[str, Tensor], lora: LoraTasks, source: str
) -> Tensor:
    """``weight`` ``(rows, cols)`` plus the chosen task's update (unchanged without a task)."""
    a, b = state.get(f"{layer}{ADAPTER}A"), state.get(f"{layer}{ADAPTER}B")
    if a is None or b is None:
        raise ModelFolderError(
            f"{source}: {layer}{ORIGINAL} has no {layer}{ADAPTER}A and {layer}{ADAPTER}B."
        )
    n, r = len(lora.tasks), lora.rank
    rows, cols = weight.shape if weight.dim() == 2 else (None, None)
    table = layer.endswith("_embeddings")
    want_a, want_b = ((n, rows, r), (n, r, cols)) if table else ((n, r, cols), (n, rows, r))
    if weight.dim() != 2 or tuple(a.shape) != want_a or tuple(b.shape) != want_b:
        raise ModelFolderError(
            f"{source}: the adapters of {layer} are lora_A {tuple(a.shape)} and lora_B "
            f"{tuple(b.shape)} for a weight of shape {tuple(weight.shape)}; config.json's "
            f"{n} lora_adaptations and lora_rank={r} need lora_A {want_a} and lora_B {want_b}."
        )
    if lora.task is None:
        return weight
    i = lora.tasks.index(lora.task)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    a_i, b_i = a[i].to(dtype), b[i].to(dtype)
    update = a_i @ b_i if table else b_i @ a_i  # (rows, cols)
    return weight.to(dtype) + lora.scale * update
