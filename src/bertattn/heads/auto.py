"""Which class runs a folder, by what it holds: ``config.json``'s ``architectures`` (a
sequence classifier: :class:`CrossEncoder`), a sentence-transformers ``modules.json`` with
``SpladePooling`` (:class:`SparseEncoder`; a plain masked LM only when asked: ``sparse``),
one with ``MultiVectorMask`` or ``model_type`` ``MultiVectorEncoder``
(:class:`MultiVectorEncoder`), an encoder with ``colbert_linear.pt`` and ``sparse_linear.pt``
beside it (bge-m3: :class:`M3Encoder`); anything else is an encoder (:class:`bertattn.Bert`).
The server loads its ``--model`` so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..encoder import ModelFolder, resolve_model
from ..encoder.folder import locate_model
from .config import read_head_config
from .sparse_folder import read_sparse_folder

__all__ = [
    "is_m3_folder",
    "is_masked_lm",
    "is_multi_vector_folder",
    "is_splade_folder",
    "load_auto",
    "resolve_auto",
]


def is_splade_folder(path: str | Path | None) -> bool:
    """A sentence-transformers folder whose ``modules.json`` has ``SpladePooling``: SPLADE
    by its own word (a plain ``BertForMaskedLM`` folder may be SPLADE or a plain BERT such as
    bert-base-uncased: only the caller can say, e.g. ``--sparse``)."""
    if path is None:
        return False
    try:
        modules = locate_model(path) / "modules.json"
        return modules.is_file() and "SpladePooling" in modules.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False


def is_multi_vector_folder(path: str | Path | None) -> bool:
    """A sentence-transformers ``MultiVectorEncoder`` folder: ``modules.json`` with a
    ``MultiVectorMask``, or ``config_sentence_transformers.json`` saying so."""
    if path is None:
        return False
    try:
        root = locate_model(path)
        modules = root / "modules.json"
        if modules.is_file() and "MultiVectorMask" in modules.read_text(encoding="utf-8"):
            return True
        st = root / "config_sentence_transformers.json"
        return st.is_file() and '"MultiVectorEncoder"' in st.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return False


def is_m3_folder(folder: ModelFolder) -> bool:
    """bge-m3: ``colbert_linear.pt`` and ``sparse_linear.pt`` beside the encoder's weights."""
    return all((folder.model_dir / f).is_file() for f in ("colbert_linear.pt", "sparse_linear.pt"))


def is_masked_lm(path: str | Path | None) -> bool:
    """A folder that can run as SPLADE: a SpladePooling folder, or a ``BertForMaskedLM``."""
    if is_splade_folder(path):
        return True
    try:
        folder = resolve_model(path)
        return read_head_config(folder.model_dir, folder.root).kind == "masked-lm"
    except (OSError, ValueError):
        return False


def resolve_auto(path: str | Path | None, *, sparse: bool = False) -> tuple[ModelFolder, str]:
    """``(the encoder's folder, kind)``, kind ``"embedding"`` / ``"sequence-classification"`` /
    ``"masked-lm"`` / ``"multi-vector"`` / ``"m3"``, read and checked without loading weights.
    A masked LM is run as SPLADE when its folder says so (SpladePooling) or ``sparse``; else
    as an encoder, as before."""
    if is_splade_folder(path):
        return read_sparse_folder(path)[0], "masked-lm"
    if is_multi_vector_folder(path) and not sparse:
        from .multi_vector import read_multi_vector_folder

        return read_multi_vector_folder(path)[0], "multi-vector"  # type: ignore[arg-type]
    folder = resolve_model(path)
    if is_m3_folder(folder) and not sparse:
        return folder, "m3"
    kind = read_head_config(folder.model_dir, folder.root).kind
    if kind == "sequence-classification" or (kind == "masked-lm" and sparse):
        return folder, kind
    if sparse:
        raise ValueError(
            f"{folder.config_path}: architectures is "
            f"{read_head_config(folder.model_dir).architecture or 'not given'}; sparse (SPLADE) "
            f"rows need a BertForMaskedLM checkpoint: drop --sparse."
        )
    return folder, "embedding"


def load_auto(path: str | Path | None, *, sparse: bool = False, **load: Any) -> Any:
    """The loaded model for ``path`` (see the module docstring and :func:`resolve_auto`);
    ``load``: ``dtype``, ``device``, ``threads``, ``backend``."""
    from ..encoder import Bert
    from .cross_encoder import CrossEncoder
    from .sparse import SparseEncoder

    folder, kind = resolve_auto(path, sparse=sparse)
    if kind == "sequence-classification":
        return CrossEncoder(folder, **load)
    if kind == "masked-lm":
        return SparseEncoder(folder.root if path is None else path, **load)
    if kind == "multi-vector":
        from .multi_vector import MultiVectorEncoder

        return MultiVectorEncoder(path, **load)  # type: ignore[arg-type]
    if kind == "m3":
        from .m3 import M3Encoder

        return M3Encoder(folder.root if path is None else path, **load)
    return Bert.load(folder, **load)
