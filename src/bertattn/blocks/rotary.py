"""Rotary tables per layer kind, computed once per forward and shared by the layers of a kind.

A rotary model may rotate its layers with different bases (ModernBERT: theta 160,000 on its
global layers, 10,000 on its local ones) and give some of them a window: a :class:`LayerKind`
says which, and :class:`RotaryTables` turns positions into the
:class:`~bertattn.attention.rotary.Rotation` each kind needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention.padding import PackedBatch
from ..attention.rotary import (
    Rotation,
    inverse_frequencies,
    rotation_for_packed,
    rotation_for_positions,
)

__all__ = ["LayerKind", "RotaryTables", "packed_positions"]


@dataclass(frozen=True)
class LayerKind:
    """What a layer's attention does with positions: rotary base ``theta`` (None: no rotation)
    and local ``window`` (query i sees key j when ``|i - j| <= window``; None: every key)."""

    theta: float | None
    window: int | None = None

    def describe(self) -> str:
        what = "global" if self.window is None else f"local (window {self.window})"
        return what if self.theta is None else f"{what}, rotary theta {self.theta:g}"


def packed_positions(packed: PackedBatch, device: torch.device) -> Tensor:
    """``(T,)`` positions of packed tokens, from 0 in every sequence."""
    counts = torch.diff(packed.cu_seqlens.to(device))  # (B,) tokens per sequence
    starts = torch.repeat_interleave(packed.cu_seqlens[:-1].to(device), counts)  # (T,)
    return torch.arange(packed.total, device=device) - starts


class RotaryTables:
    """The rotations of one forward, one per base: ``padded(L)`` gives ``(L, D)`` tables, and
    ``packed(positions)`` ``(T, 1, D)`` ones. Not a module: nothing here is a weight."""

    def __init__(self, head_dim: int) -> None:
        self.head_dim = head_dim

    def _inv(self, theta: float, device: torch.device) -> Tensor:
        return inverse_frequencies(self.head_dim, theta, device=device)  # (D/2,)

    def padded(self, kinds: list[LayerKind], length: int, device: torch.device) -> dict:
        """``theta -> Rotation`` for positions ``0..length-1``."""
        pos = torch.arange(length, device=device)
        return {
            k.theta: rotation_for_positions(pos, self._inv(k.theta, device), k.theta)
            for k in kinds
            if k.theta is not None
        }

    def packed(self, kinds: list[LayerKind], positions: Tensor) -> dict[float, Rotation]:
        """``theta -> Rotation`` for packed ``positions`` ``(T,)``."""
        dev = positions.device
        return {
            k.theta: rotation_for_packed(positions, self._inv(k.theta, dev), k.theta)
            for k in kinds
            if k.theta is not None
        }
