"""bertattn's cache folder, where ``bertattn get-model NAME`` puts a model (``models/NAME``), and
how a folder there is known to be one bertattn made, whole.

The cache folder is, in order: ``$BERTATTN_CACHE``; ``$XDG_CACHE_HOME/bertattn`` (when that
variable holds an absolute path, as the XDG base directory specification asks); else
``~/.cache/bertattn``. Standard library only: :func:`bertattn.encoder.folder.locate_model` uses it
to resolve a bare model name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "CACHE_ENV",
    "CONVERTED_BY",
    "cache_dir",
    "is_complete",
    "is_made_by_bertattn",
    "model_dir",
]

#: the environment variable that moves the cache folder
CACHE_ENV = "BERTATTN_CACHE"
#: how ``PROVENANCE.json``'s ``converted_by`` starts in a folder bertattn wrote
CONVERTED_BY = "bertattn "
#: the files a finished folder has (it is written elsewhere and renamed into place whole)
_FINISHED = ("PROVENANCE.json", "config.json", "model.safetensors", "tokenizer.json")


def cache_dir() -> Path:
    """The cache folder (see the module docstring); it need not exist yet."""
    own = os.environ.get(CACHE_ENV, "").strip()
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "bertattn"
    return Path.home() / ".cache" / "bertattn"


def model_dir(name: str) -> Path:
    """Where ``bertattn get-model NAME`` puts the model by default: ``CACHE/models/NAME``."""
    return cache_dir() / "models" / name


def is_made_by_bertattn(folder: Path) -> bool:
    """``folder`` has a ``PROVENANCE.json`` that bertattn wrote (``converted_by`` starts with
    ``bertattn``): a folder ``get-model`` may replace."""
    try:
        data = json.loads((folder / "PROVENANCE.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    made = data.get("converted_by") if isinstance(data, dict) else None
    return isinstance(made, str) and made.startswith(CONVERTED_BY)


def is_complete(folder: Path) -> bool:
    """``folder`` is a whole model folder that bertattn made: its provenance says so and every
    file a finished folder has is there."""
    return all((folder / f).is_file() for f in _FINISHED) and is_made_by_bertattn(folder)
