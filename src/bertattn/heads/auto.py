"""Which class runs a folder, as the head kinds' records (:mod:`.registry`) detect it: a
sequence classifier (:class:`CrossEncoder`), a sentence-transformers ``modules.json`` with
``SpladePooling`` (:class:`SparseEncoder`; a plain masked LM only when asked: ``sparse``), a
``MultiVectorEncoder`` folder (:class:`MultiVectorEncoder`), an encoder with
``colbert_linear.pt`` and ``sparse_linear.pt`` beside it (bge-m3: :class:`M3Encoder`); anything
else is an encoder (:class:`bertattn.Bert`). The server loads its ``--model`` so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..encoder import ModelFolder
from .registry import FolderProbe, detect

__all__ = [
    "is_multi_vector_folder",
    "is_splade_folder",
    "load_auto",
    "resolve_auto",
]


def is_splade_folder(path: str | Path | None) -> bool:
    """A sentence-transformers folder whose ``modules.json`` has ``SpladePooling``: SPLADE
    by its own word (a plain ``BertForMaskedLM`` folder may be SPLADE or a plain BERT such as
    bert-base-uncased: only the caller can say, e.g. ``--sparse``)."""
    return FolderProbe(path).splade


def is_multi_vector_folder(path: str | Path | None) -> bool:
    """A multi-vector (ColBERT) folder: sentence-transformers' ``MultiVectorEncoder``, PyLate's
    or Stanford ColBERT's (see :attr:`.registry.FolderProbe.multi_vector`)."""
    return FolderProbe(path).multi_vector


def resolve_auto(path: str | Path | None, *, sparse: bool = False) -> tuple[ModelFolder, str]:
    """``(the encoder's folder, kind)``, read and checked without loading weights; kind as
    this function always spelled it: ``"embedding"`` / ``"sequence-classification"`` /
    ``"masked-lm"`` / ``"multi-vector"`` / ``"m3"`` (the record's ``alias``, else its name;
    :func:`.registry.detect` gives the record). A masked LM is run as SPLADE when its folder
    says so (SpladePooling) or ``sparse``; else as an encoder."""
    kind, probe = detect(path, sparse=sparse)
    return kind.encoder(probe), kind.alias or kind.name


def load_auto(path: str | Path | None, *, sparse: bool = False, **load: Any) -> Any:
    """The loaded model for ``path`` (see the module docstring and :func:`resolve_auto`);
    ``load``: ``dtype``, ``device``, ``threads``, ``backend``."""
    kind, probe = detect(path, sparse=sparse)
    kind.encoder(probe)  # the folder checked as the kind reads it, before any weights
    return kind.load(probe, **load)  # type: ignore[misc]
