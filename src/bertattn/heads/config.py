"""What a checkpoint says about its head: ``config.json``'s ``architectures``, ``num_labels``
(from ``id2label``), ``problem_type``, and sentence-transformers' CrossEncoder activation.

Nothing here imports code named by a folder: an activation is looked up by name in a fixed
table of torch's own (:data:`ACTIVATIONS`); any other name is reported and the default used.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ModelFolderError
from ..families import registry as families

logger = logging.getLogger("bertattn.heads")

__all__ = ["ACTIVATIONS", "HeadConfig", "read_head_config"]

#: activation names sentence-transformers writes (its class paths) -> the ``torch.nn`` module
#: (a module, as sentence-transformers holds it: it prints, pickles and saves by name)
ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    "torch.nn.modules.activation.Sigmoid": torch.nn.Sigmoid,
    "torch.nn.modules.linear.Identity": torch.nn.Identity,
    "torch.nn.modules.activation.Tanh": torch.nn.Tanh,
    "torch.nn.Sigmoid": torch.nn.Sigmoid,
    "torch.nn.Identity": torch.nn.Identity,
    "torch.nn.Tanh": torch.nn.Tanh,
}

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


@dataclass(frozen=True)
class HeadConfig:
    """A checkpoint's head settings.

    Attributes:
        architecture: ``config.json``'s first ``architectures`` entry (None when absent).
        kind: ``"sequence-classification"`` / ``"token-classification"`` / ``"masked-lm"``
            (None: a bare encoder, or a class bertattn does not run).
        num_labels: outputs of a classifier (``id2label``'s size; 2 when absent, as
            transformers).
        id2label: label names by output index.
        problem_type: transformers' ``problem_type`` (None: not said).
        activation: the sentence-transformers CrossEncoder activation's name, when the folder
            gives one bertattn knows (see :data:`ACTIVATIONS`).
    """

    architecture: str | None
    kind: str | None
    num_labels: int
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str | None = None
    activation: str | None = None

    def default_activation(self) -> torch.nn.Module:
        """The CrossEncoder's scores function, a new ``torch.nn`` module: the folder's, else
        ``nn.Sigmoid()`` for one label and ``nn.Identity()`` for several (sentence-transformers'
        rule)."""
        if self.activation is not None:
            return ACTIVATIONS[self.activation]()
        return torch.nn.Sigmoid() if self.num_labels == 1 else torch.nn.Identity()


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelFolderError(f"{path} does not hold a JSON object.")
    return raw


def _activation(root: Path, raw: dict) -> str | None:
    """The activation a sentence-transformers CrossEncoder folder names: in
    ``config_sentence_transformers.json`` (v6), ``config.json``'s ``sentence_transformers``
    (v4-v5) or ``sbert_ce_default_activation_function`` (before v4)."""
    name = None
    st_file = root / "config_sentence_transformers.json"
    if st_file.is_file():
        name = _read_json(st_file).get("activation_fn")
    block = raw.get("sentence_transformers")
    if name is None and isinstance(block, dict):
        name = block.get("activation_fn")
    if name is None:
        name = raw.get("sbert_ce_default_activation_function")
    if name is None:
        return None
    if name not in ACTIVATIONS:
        msg = (
            f"{root}: activation {str(name)[:100]!r} is not one bertattn runs "
            f"({', '.join(sorted({k.rsplit('.', 1)[1] for k in ACTIVATIONS}))}); using the "
            f"default (sigmoid for one label, none for several); pass activation_fn= to choose"
        )
        logger.warning("%s", msg)
        warnings.warn(msg, stacklevel=3)
        return None
    return str(name)


def read_head_config(model_dir: Path, root: Path | None = None) -> HeadConfig:
    """The head settings of ``model_dir/config.json`` (``root``: the sentence-transformers
    folder around it, for the CrossEncoder activation; default ``model_dir``)."""
    raw = _read_json(model_dir / "config.json")
    arches = raw.get("architectures") or []
    arch = str(arches[0]) if isinstance(arches, list) and arches else None
    labels = raw.get("id2label")
    id2label: dict[int, str] = {}
    if isinstance(labels, dict):
        try:
            id2label = {int(k): str(v) for k, v in labels.items()}
        except ValueError:
            raise ModelFolderError(
                f"{model_dir / 'config.json'}: id2label keys must be label indices, got "
                f"{sorted(labels)[:5]}."
            ) from None
    num_labels = len(id2label) if id2label else int(raw.get("num_labels", 2))
    if id2label and sorted(id2label) != list(range(num_labels)):
        raise ModelFolderError(
            f"{model_dir / 'config.json'}: id2label indices {sorted(id2label)} are not "
            f"0..{num_labels - 1}."
        )
    problem = raw.get("problem_type")
    if problem is not None and problem not in PROBLEM_TYPES:
        raise ModelFolderError(
            f"{model_dir / 'config.json'}: problem_type {str(problem)[:60]!r} is not one of "
            f"{', '.join(PROBLEM_TYPES)}."
        )
    return HeadConfig(
        architecture=arch,
        kind=families.head_kind(arch),  # each family's record names its task classes
        num_labels=num_labels,
        id2label=id2label or {i: f"LABEL_{i}" for i in range(num_labels)},
        problem_type=problem,
        activation=_activation(root or model_dir, raw),
    )
