"""On/off switches read from environment variables, one spelling for all of bertattn's."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import UsageError

__all__ = ["env_switch"]

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def env_switch(name: str, fix: str, environ: Mapping[str, str] | None = None) -> bool:
    """The switch ``name`` in ``environ`` (default ``os.environ``): unset, empty, 1, true, on,
    yes (any case) are on; 0, false, off, no are off. Anything else raises
    :class:`~bertattn.errors.UsageError` (a ``ValueError``) ending with ``fix`` (what setting
    it to 0 does): a misspelt "off" must not mean on."""
    environ = os.environ if environ is None else environ
    text = environ.get(name, "").strip().lower()
    if text in ("", *_ON):
        return True
    if text in _OFF:
        return False
    raise UsageError(
        f"{name}={environ[name]!r} is not one of 1/0, true/false, on/off, yes/no; set {name}=0 "
        f"to {fix}, or unset it."
    )
