"""Old module names kept for one release: :func:`moved` makes an old name the new module."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str) -> None:
    """Make the module ``old`` (being imported) the module ``new``, with a
    ``DeprecationWarning`` naming the new place."""
    warnings.warn(
        f"{old} is deprecated: import {new} instead.", DeprecationWarning, stacklevel=3
    )
    sys.modules[old] = importlib.import_module(new)
