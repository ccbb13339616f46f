"""Moved to :mod:`bertattn.runtime.openmp`; this name still imports it for one release, with a
``DeprecationWarning``."""

import sys
import warnings

from .runtime import openmp as _moved

warnings.warn(
    "bertattn.openmp is deprecated: import bertattn.runtime.openmp instead.",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
