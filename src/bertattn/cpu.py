"""Moved to :mod:`bertattn.runtime.cpu`; this name imports it for one release, warning."""

from ._moved import moved

moved(__name__, "bertattn.runtime.cpu")
