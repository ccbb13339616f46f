"""Deprecated: ``bertattn.bert`` was split into :mod:`bertattn.encoder` (the encoder runtime
every family runs through: model, loading, tokenizer, the ``Bert`` facade, speed paths) and
:mod:`bertattn.runtime` (the machine: probe cache, devices, chunk workers). Its old names,
``bertattn.bert.int8`` included, still import for one release, with a ``DeprecationWarning``."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from ..encoder import *  # noqa: F403
from ..encoder import __all__  # noqa: F401

#: the submodules that moved to bertattn.runtime; every other one is in bertattn.encoder
_TO_RUNTIME = frozenset({"probe", "device", "workers"})

warnings.warn(
    "bertattn.bert is deprecated: import from bertattn.encoder (the model, loading, Bert) or "
    "bertattn.runtime (probe, device, workers) instead.",
    DeprecationWarning,
    stacklevel=2,
)


def _new_name(old: str) -> str:
    short = old.rsplit(".", 1)[1]
    return f"bertattn.{'runtime' if short in _TO_RUNTIME else 'encoder'}.{short}"


class _Loader(importlib.abc.Loader):
    """Gives the moved module itself. The import system stamps the old name's spec on the
    module it gets; :meth:`exec_module` puts the module's own spec back, so that its relative
    imports keep resolving against its real package (no ``ImportWarning``)."""

    def __init__(self) -> None:
        self._spec = None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = importlib.import_module(_new_name(spec.name))
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    """``import bertattn.bert.X`` gives the module ``X`` moved to."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if not name.startswith(__name__ + ".") or name.count(".") != 2:
            return None
        if importlib.util.find_spec(_new_name(name)) is None:
            return None
        return importlib.util.spec_from_loader(name, _Loader())


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
