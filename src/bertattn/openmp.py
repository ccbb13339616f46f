"""Moved to :mod:`bertattn.runtime.openmp`; this name imports it for one release, warning."""

from ._moved import moved

moved(__name__, "bertattn.runtime.openmp")
