"""``save(path)`` / ``save_pretrained(path)`` of the head classes: the folder the model was
loaded from, copied (weights, tokenizer, sentence-transformers modules; never ONNX or other
frameworks' weights), with the settings set since loading written into the JSON files
sentence-transformers and bertattn both read (prompts, similarity, max length, ...). The
folder appears whole or not at all: it is written under a temporary name beside ``path`` and
renamed into place."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..arguments import describe
from ..encoder.folder import ModelFolder
from ..encoder.jsonfile import read_json_object

logger = logging.getLogger("bertattn.heads")

__all__ = ["model_files", "save_folder", "transformer_modules"]

#: sentence-transformers' Transformer module, as its ``modules.json`` names it
TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"

#: what a saved folder leaves out: other frameworks' weights and exports, caches, VCS data
_LEAVE_OUT = shutil.ignore_patterns(
    ".git", ".cache", "onnx", "openvino", "*.onnx", "tf_model.h5", "flax_model.msgpack",
    "rust_model.ot", "*.lock", ".*.tmp",
)  # fmt: skip


def _target(path: object, source: Path) -> Path:
    """``path`` checked: a new folder, or an empty one, not inside the folder copied."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a folder path (str or os.PathLike), got {describe(path)}.")
    out = Path(path).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} exists and is not an empty folder; save into a new or empty folder (remove "
            f"it first to replace it)."
        )
    if out == source.absolute() or source.absolute() in out.parents:
        raise ValueError(f"{out} is inside the model's own folder {source}; save elsewhere.")
    return out


def _merge_json(path: Path, keys: Mapping[str, Any] | list[Any]) -> None:
    """Write ``keys`` over the JSON object in ``path`` (created when absent); a list is
    written as the whole file (``modules.json``)."""
    data: Any = keys
    if isinstance(keys, Mapping):
        data = {**(read_json_object(path) if path.is_file() else {}), **keys}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_folder(folder: ModelFolder, path: object, files: Mapping[str, Any]) -> Path:
    """Copy ``folder``'s root to ``path`` (a new or empty folder) with ``files`` (a path
    relative to the saved folder -> the JSON keys written over that file) applied; returns the
    saved folder's path. Raises ``FileExistsError`` for a folder with files in it and
    ``ValueError`` for a path inside the source folder; on any failure nothing is left."""
    source = folder.root
    out = _target(path, source)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        shutil.copytree(source, tmp, ignore=_LEAVE_OUT, symlinks=False)  # a hub cache's links
        for rel, keys in files.items():
            _merge_json(tmp / rel, keys)
        if out.is_dir():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("saved %s to %s", folder.name, out)
    return out


def model_files(folder: ModelFolder, max_length: int) -> dict[str, dict[str, Any]]:
    """The encoder's files a saved folder updates: the tokenizer's ``model_max_length`` (what
    sentence-transformers writes and both read), and ``max_seq_length`` where the folder's
    ``sentence_bert_config.json`` has one."""
    rel = folder.model_dir.relative_to(folder.root)
    out: dict[str, dict[str, Any]] = {
        str(rel / "tokenizer_config.json"): {"model_max_length": max_length}
    }
    sbert = folder.model_dir / "sentence_bert_config.json"
    if sbert.is_file() and "max_seq_length" in read_json_object(sbert):
        out[str(rel / "sentence_bert_config.json")] = {"max_seq_length": max_length}
    return out


def transformer_modules(task: str, output: str, *after: dict[str, str]) -> dict[str, Any]:
    """The sentence-transformers module files of a model saved from a plain Hugging Face folder
    (which sentence-transformers would otherwise load with its own defaults): ``modules.json``
    (the Transformer at the root, then ``after``'s entries, each ``{"path", "type"}``) and the
    Transformer's ``sentence_bert_config.json`` (its ``task``, its logits as ``output``)."""
    entries = [{"path": "", "type": TRANSFORMER}, *after]
    return {
        "modules.json": [{"idx": i, "name": str(i), **e} for i, e in enumerate(entries)],
        "sentence_bert_config.json": {
            "transformer_task": task,
            "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
            "module_output_name": output,
        },
    }
