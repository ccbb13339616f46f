"""Moved to :mod:`bertattn.capture` (a low-level module: :mod:`bertattn.arguments` asks it too);
this name stays so that imports of ``bertattn.attention.capture`` keep working."""

from ..capture import capturing, is_capturing

__all__ = ["capturing", "is_capturing"]
