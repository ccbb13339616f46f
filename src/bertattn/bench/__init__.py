"""Benchmarks that ship with the package (``bertattn bench``); the rest live in benchmarks/."""

from .timing import Timer, auto_line, cpu_capability, environment, interleaved_medians

__all__ = ["Timer", "auto_line", "cpu_capability", "environment", "interleaved_medians"]
