"""A SPLADE model folder: a plain ``BertForMaskedLM`` folder (SPLADE's defaults: max pooling
of ``log(1 + relu(logits))``), or one saved by sentence-transformers' ``SparseEncoder``
(``modules.json``: the MLM transformer, then ``SpladePooling`` with its ``config.json``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..encoder.folder import (
    HubOptions,
    ModelFolder,
    locate_model,
    read_config_json,
    read_model_folder,
    read_sbert_config,
)
from ..encoder.jsonfile import read_json, read_json_object
from ..errors import ModelFolderError

logger = logging.getLogger("bertattn.heads")

__all__ = [
    "SparseSettings",
    "read_sparse_folder",
    "refuse_other_sparse",
    "refuse_other_sparse_folder",
]

_MLM_TYPES = {
    "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer",
    "sentence_transformers.sparse_encoder.modules.MLMTransformer",
    "sentence_transformers.sparse_encoder.models.MLMTransformer",
}
_TRANSFORMER_TYPES = {
    "sentence_transformers.base.modules.Transformer",
    "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.models.Transformer",
}
_SPLADE_TYPES = {
    "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
    "sentence_transformers.sparse_encoder.modules.SpladePooling",
    "sentence_transformers.sparse_encoder.models.SpladePooling",
}
STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")


@dataclass(frozen=True)
class SparseSettings:
    """How the token logits become one sparse row: ``pooling`` (``"max"`` / ``"sum"`` over
    tokens) of ``log(1 + relu(x))`` (``activation="relu"``) or ``log(1 + log(1 +
    relu(x)))`` (``"log1p_relu"``)."""

    pooling: str = "max"
    activation: str = "relu"
    #: ``config_sentence_transformers.json``'s similarity function (None: not said, dot)
    similarity_fn_name: str | None = None
    #: ``config_sentence_transformers.json``'s ``max_active_dims`` (None: all)
    max_active_dims: int | None = None


def _read_max_active_dims(root: Path) -> int | None:
    """The folder's ``max_active_dims`` (``config_sentence_transformers.json``; None: all)."""
    path = root / "config_sentence_transformers.json"
    value = read_json_object(path).get("max_active_dims") if path.is_file() else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ModelFolderError(
            f"{path}: max_active_dims must be null or an int >= 1, got {str(value)[:40]!r}."
        )
    return value


def _read_similarity(root: Path) -> str | None:
    """The folder's ``similarity_fn_name`` when it is one a SparseEncoder takes; another name
    (``"maxsim"``, from a multi-vector model) is reported and left out (dot), as
    sentence-transformers leaves it out."""
    from ..encoder.st_compat import SIMILARITY_FN_NAMES

    path = root / "config_sentence_transformers.json"
    if not path.is_file():
        return None
    name = read_json_object(path).get("similarity_fn_name")
    if name is None or name in SIMILARITY_FN_NAMES:
        return name
    logger.warning(
        "%s: similarity_fn_name %r is not one a SparseEncoder takes (%s); using dot.",
        path,
        str(name)[:60],
        ", ".join(SIMILARITY_FN_NAMES),
    )
    return None


def _entry_error(path: Path, i: int, kind: object) -> ModelFolderError:
    return ModelFolderError(
        f"{path}: entry {i}: module type {str(kind)[:120]!r} is not part of a SPLADE model "
        f"bertattn runs (the MLM transformer, then SpladePooling)."
    )


def _read_pooling(path: Path, root: Path) -> SparseSettings:
    cfg = read_json_object(path)
    pooling = cfg.get("pooling_strategy", "max")
    act = cfg.get("activation_function", "relu")
    if pooling not in STRATEGIES or act not in ACTIVATIONS:
        raise ModelFolderError(
            f"{path}: pooling_strategy must be one of {STRATEGIES} and activation_function one "
            f"of {ACTIVATIONS}; got {str(pooling)[:40]!r} and {str(act)[:40]!r}."
        )
    return SparseSettings(pooling, act, _read_similarity(root), _read_max_active_dims(root))


#: sparse architectures sentence-transformers' SparseEncoder also loads, which are not SPLADE:
#: a module type's last part -> the refusal
_OTHER_SPARSE = {
    "SparseAutoEncoder": (
        "CSR (a SparseAutoEncoder over a dense model's pooled embedding) is not SPLADE: bertattn "
        "runs SPLADE only (a masked-LM head over every token, then SpladePooling)"
    ),
    "Router": (
        "inference-free SPLADE (a Router sending queries to SparseStaticEmbedding, documents to "
        "the MLM transformer) is not run by bertattn: it runs SPLADE with one encoder for both"
    ),
    "SparseStaticEmbedding": (
        "inference-free SPLADE (SparseStaticEmbedding: queries weighted without an encoder) is "
        "not run by bertattn: it runs SPLADE with one encoder for both"
    ),
}


def refuse_other_sparse(modules: Path, data: object, who: str | None = None) -> None:
    """A sparse architecture that is not SPLADE (CSR, inference-free SPLADE) in ``modules.json``
    (``data``: its contents) refused by name, with what loads it; ``who``: the class asked
    to load it when that is not a SparseEncoder (``"a CrossEncoder"``), said too."""
    if not isinstance(data, list):
        return
    for i, entry in enumerate(data):
        kind = str(entry.get("type", "")) if isinstance(entry, dict) else ""
        why = _OTHER_SPARSE.get(kind.rsplit(".", 1)[-1])
        if why is not None:
            other = f"; {who} does not run it either" if who else ""
            raise ModelFolderError(
                f"{modules}: entry {i} is {kind[:120]}: {why}{other}; load it with "
                f"sentence-transformers' SparseEncoder."
            )


def refuse_other_sparse_folder(root: Path, who: str) -> None:
    """:func:`refuse_other_sparse` on ``root``'s ``modules.json``, when it has one that
    parses (anything else is left for the folder's own reader to explain)."""
    modules = root / "modules.json"
    if modules.is_file():
        try:
            data = read_json(modules)
        except ModelFolderError:
            return
        refuse_other_sparse(modules, data, who)


def read_sparse_folder(
    path: str | Path | None, *, hub: HubOptions | None = None
) -> tuple[ModelFolder, SparseSettings]:
    """The encoder's :class:`ModelFolder` and the SPLADE settings of ``path`` (a folder or a
    cached hub name, fetched with ``hub``)."""
    if path is None:
        raise ValueError("a SparseEncoder needs a model: a SPLADE folder or a cached hub name.")
    root = locate_model(path, hub=hub)
    modules = root / "modules.json"
    if not modules.is_file():
        folder = read_model_folder(root, name=str(path))
        return folder, SparseSettings(
            similarity_fn_name=_read_similarity(root), max_active_dims=_read_max_active_dims(root)
        )
    data = read_json(modules)
    refuse_other_sparse(modules, data)
    if not isinstance(data, list) or len(data) != 2 or not all(isinstance(m, dict) for m in data):
        raise ModelFolderError(
            f"{modules}: a SPLADE model has two modules (the MLM transformer, then "
            f"SpladePooling); got {len(data) if isinstance(data, list) else 'no list'}."
        )
    first, second = data
    kind = first.get("type")
    model_dir = root / str(first.get("path", ""))
    files: list[Path] = [modules]
    max_length, lower = read_sbert_config(model_dir, files)
    if kind in _TRANSFORMER_TYPES:  # sentence-transformers >= 6: its task says fill-mask
        task = read_json_object(model_dir / "sentence_bert_config.json").get("transformer_task")
        if task != "fill-mask":
            raise ModelFolderError(
                f"{model_dir / 'sentence_bert_config.json'}: transformer_task is "
                f"{str(task)[:40]!r}; a SPLADE model's transformer is 'fill-mask'."
            )
    elif kind not in _MLM_TYPES:
        raise _entry_error(modules, 0, kind)
    if second.get("type") not in _SPLADE_TYPES:
        raise _entry_error(modules, 1, second.get("type"))
    settings = _read_pooling(root / str(second.get("path", "")) / "config.json", root)
    folder = ModelFolder(
        str(path),
        root,
        model_dir,
        read_config_json(model_dir),
        max_length=max_length,
        settings_files=tuple(files),
        do_lower_case=lower,
    )
    return folder, settings
