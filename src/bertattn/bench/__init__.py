"""Benchmarks that ship with the package (``bertattn bench``); the rest live in benchmarks/."""

from .timing import Timer, environment, interleaved_medians

__all__ = ["Timer", "environment", "interleaved_medians"]
