"""Which class runs a folder, by what it holds: ``config.json``'s ``architectures`` (a
sequence classifier: :class:`CrossEncoder`; a masked LM: :class:`SparseEncoder`), or a
sentence-transformers ``modules.json`` with ``SpladePooling`` (:class:`SparseEncoder`); anything
else is an encoder (:class:`bertattn.Bert`). The server loads its ``--model`` so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bert import ModelFolder, resolve_model
from ..bert.folder import locate_model
from .config import read_head_config
from .sparse_folder import read_sparse_folder

__all__ = ["load_auto", "resolve_auto"]


def _is_splade_folder(root: Path) -> bool:
    modules = root / "modules.json"
    return modules.is_file() and "SpladePooling" in modules.read_text(encoding="utf-8")


def resolve_auto(path: str | Path | None) -> tuple[ModelFolder, str]:
    """``(the encoder's folder, kind)``, kind ``"embedding"`` / ``"sequence-classification"`` /
    ``"masked-lm"``, read and checked without loading weights."""
    if path is not None and _is_splade_folder(locate_model(path)):
        return read_sparse_folder(path)[0], "masked-lm"
    folder = resolve_model(path)
    kind = read_head_config(folder.model_dir, folder.root).kind
    if kind in ("sequence-classification", "masked-lm"):
        return folder, kind
    return folder, "embedding"


def load_auto(path: str | Path | None, **load: Any) -> Any:
    """The loaded model for ``path`` (see the module docstring); ``load``: ``dtype``,
    ``device``, ``threads``, ``backend``."""
    from ..bert import Bert
    from .cross_encoder import CrossEncoder
    from .sparse import SparseEncoder

    folder, kind = resolve_auto(path)
    if kind == "sequence-classification":
        return CrossEncoder(folder, **load)
    if kind == "masked-lm":
        return SparseEncoder(folder.root if path is None else path, **load)
    return Bert.load(folder, **load)
