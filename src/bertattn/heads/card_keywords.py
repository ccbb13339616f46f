"""The constructor keywords model cards pass to sentence-transformers' ``CrossEncoder``,
``SparseEncoder`` and ``MultiVectorEncoder``, taken once for bertattn's three head classes:

* ``revision``, ``local_files_only``, ``cache_folder``, ``token``: how a hub name is fetched
  (:class:`~bertattn.encoder.folder.HubOptions`, huggingface_hub's meaning);
* ``torch_dtype=``, ``model_kwargs={"torch_dtype": ...}`` / ``automodel_args={...}`` (or
  ``"dtype"`` in them): taken as bertattn's ``dtype``;
* ``trust_remote_code=True``: accepted and noted in a log line (bertattn runs the architecture
  natively or refuses it by name; no code from the folder is run);
* ``num_labels=`` (where the class takes it): checked against the folder's head.

Any other unknown keyword is a ``TypeError`` naming it and bertattn's nearest equivalent.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..arguments import check_bool, check_int, describe
from ..encoder.folder import HubOptions

logger = logging.getLogger("bertattn.heads")

__all__ = ["CARD_KEYWORDS", "CardKeywords", "card_keywords", "check_num_labels"]

#: the keywords :func:`card_keywords` takes (beyond each class's own parameters)
CARD_KEYWORDS = (
    "revision",
    "local_files_only",
    "cache_folder",
    "token",
    "trust_remote_code",
    "torch_dtype",
    "model_kwargs",
    "automodel_args",
)
#: keywords of transformers / sentence-transformers with another name here
_EQUIVALENTS = {
    "cache_dir": "cache_folder",
    "use_auth_token": "token",
    "model_name_or_path": "the first argument (model)",
    "model_name": "the first argument (model)",
    "default_activation_function": "activation_fn",
    "attn_implementation": "backend",
    "device_map": "device",
    "max_seq_length": "max_length",
    "num_threads": "threads",
}
#: keys of ``model_kwargs`` / ``automodel_args`` that mean the dtype
_DTYPE_KEYS = ("torch_dtype", "dtype")


@dataclass(frozen=True)
class CardKeywords:
    """What the model-card keywords asked for: ``hub`` (how a hub name is fetched), ``dtype``
    (the dtype given by any of its names; None: not given), ``num_labels`` (None: not
    given)."""

    hub: HubOptions = field(default_factory=HubOptions)
    dtype: Any = None
    num_labels: int | None = None


def _unknown(who: str, name: str, accepted: Iterable[str]) -> TypeError:
    """The ``TypeError`` for keyword ``name``: bertattn's equivalent, else the closest name
    ``who`` takes, else the names it takes."""
    names = sorted(set(accepted))
    equivalent = _EQUIVALENTS.get(name)
    if equivalent is not None and (equivalent in names or equivalent.startswith("the ")):
        hint = f"bertattn's equivalent is {equivalent}" + ("=" if equivalent in names else "")
    else:
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}=?" if close else f"it takes {', '.join(names)}"
    return TypeError(f"{who}() got an unexpected keyword argument {name!r}; {hint}.")


def _dtype_of(who: str, name: str, value: object, accepted: Iterable[str]) -> Any:
    """The dtype in ``model_kwargs`` / ``automodel_args`` (None: none there); any other key is
    refused by name."""
    if not isinstance(value, dict):
        raise TypeError(
            f'{who}(): {name} must be a dict such as {{"torch_dtype": "float16"}}, got '
            f"{describe(value)}."
        )
    for key in value:
        if key not in _DTYPE_KEYS:
            err = _unknown(who, str(key), accepted)
            raise TypeError(f"{name}[{key!r}]: {str(err).split('; ', 1)[1]} (bertattn takes "
                            f"only the dtype from {name}).")  # fmt: skip
    found = [value[k] for k in _DTYPE_KEYS if k in value]
    if len(found) == 2 and str(found[0]) != str(found[1]):
        raise ValueError(f"{who}(): {name} gives torch_dtype={found[0]} and dtype={found[1]}; "
                         f"give one (dtype=).")  # fmt: skip
    return found[0] if found else None


def _one_dtype(who: str, given: list[tuple[str, Any]]) -> Any:
    """The one dtype of ``given`` (``(where, value)``, values None left out); two that differ
    are a ``ValueError`` naming both."""
    given = [(w, v) for w, v in given if v is not None]
    for where, value in given[1:]:
        if str(value).replace("torch.", "") != str(given[0][1]).replace("torch.", ""):
            raise ValueError(
                f"{who}(): {given[0][0]}={given[0][1]} and {where}={value} disagree; give the "
                f"dtype once, as dtype=."
            )
    return given[0][1] if given else None


def card_keywords(owner: object, given: dict[str, Any], *, dtype: Any = None) -> CardKeywords:
    """The model-card keywords in ``given`` (the ``**kwargs`` of ``owner``'s constructor) as a
    :class:`CardKeywords` (see the module docstring); ``dtype``: the class's own ``dtype=``
    argument, which a dtype given another way must agree with. ``num_labels`` is taken where
    ``owner.TAKES_NUM_LABELS`` is true. Raises ``TypeError`` for any other keyword, naming
    bertattn's equivalent."""
    who = type(owner).__name__
    params = inspect.signature(type(owner).__init__).parameters
    takes_labels = bool(getattr(owner, "TAKES_NUM_LABELS", False))
    own = [n for n, p in params.items() if n != "self" and p.kind is not p.VAR_KEYWORD]
    accepted = [*own, *CARD_KEYWORDS, *(["num_labels"] if takes_labels else [])]
    for name in given:
        if name not in accepted:
            raise _unknown(who, name, accepted)
    if check_bool(given.get("trust_remote_code", False), "trust_remote_code"):
        logger.info(
            "%s: trust_remote_code=True is not needed: bertattn runs the architecture with its "
            "own code (or refuses it by name); no code from the model folder is run.", who
        )  # fmt: skip
    dtypes = [("dtype", dtype), ("torch_dtype", given.get("torch_dtype"))]
    for name in ("model_kwargs", "automodel_args"):
        if given.get(name) is not None:
            dtypes.append((name, _dtype_of(who, name, given[name], accepted)))
    cache, token = given.get("cache_folder"), given.get("token")
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"cache_folder must be a folder path or None, got {describe(cache)}.")
    if token is not None and not isinstance(token, (str, bool)):
        raise TypeError(f"token must be a hub token (str), True/False or None, got "
                        f"{describe(token)}.")  # fmt: skip
    hub = HubOptions(
        revision=_optional_str(given.get("revision"), "revision"),
        local_files_only=check_bool(given.get("local_files_only", False), "local_files_only"),
        cache_folder=cache,
        token=token,
    )
    labels = check_int(given.get("num_labels"), "num_labels", low=1, optional=True)
    return CardKeywords(hub, _one_dtype(who, dtypes), labels)


def _optional_str(value: object, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str (a branch, tag or commit) or None, got "
                        f"{describe(value)}.")  # fmt: skip
    return value


def check_num_labels(asked: int | None, found: int, where: object) -> None:
    """``num_labels=`` as given to a reranker against the ``found`` labels of its folder's head
    (``where``: the folder's ``config.json``): None or equal is fine; different is a
    ``ValueError`` (bertattn loads the head the folder has; it makes none)."""
    if asked is not None and asked != found:
        raise ValueError(
            f"num_labels={asked} but {where} has a head of {found} label(s); leave num_labels "
            f"out (the folder's head is used) or load a folder with {asked} labels."
        )
