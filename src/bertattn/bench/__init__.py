"""Benchmarks that ship with the package (``bertattn bench``); the rest live in benchmarks/."""

from .timing import Timer, cpu_capability, environment, interleaved_medians

__all__ = ["Timer", "cpu_capability", "environment", "interleaved_medians"]
