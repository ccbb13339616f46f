"""Moved to :mod:`bertattn.runtime.threads`; this name still imports it for one release, with a
``DeprecationWarning``."""

import sys
import warnings

from .runtime import threads as _moved

warnings.warn(
    "bertattn.threads is deprecated: import bertattn.runtime.threads instead.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
