"""Pieces of the messages bertattn's errors say. A leaf: imports nothing of the package."""

from __future__ import annotations

__all__ = ["listing"]


def listing(*clauses: tuple[str, str]) -> str:
    """The clauses ``(label, text)`` whose text is not empty, each as ``label + text``, joined
    by ``"; "``: what a mismatch message lists (``("missing ", "a, b"), ("unexpected ", "")``
    gives ``"missing a, b"``)."""
    return "; ".join(label + text for label, text in clauses if text)
