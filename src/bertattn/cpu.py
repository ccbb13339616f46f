"""Moved to :mod:`bertattn.runtime.cpu`; this name still imports it for one release, with a
``DeprecationWarning``."""

import sys
import warnings

from .runtime import cpu as _moved

warnings.warn(
    "bertattn.cpu is deprecated: import bertattn.runtime.cpu instead.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
