"""Rotary tables per layer kind, computed once per forward and shared by the layers of a kind.

A rotary model may rotate its layers with different bases (ModernBERT: theta 160,000 on its
global layers, 10,000 on its local ones) and give some of them a window: a :class:`LayerKind`
says which, and :class:`RotaryTables` turns positions into the
:class:`~bertattn.attention.rotary.Rotation` each kind needs.
"""

from __future__ import annotations

import math
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

__all__ = ["LayerKind", "NtkScaling", "RotaryTables", "packed_positions"]


@dataclass(frozen=True)
class NtkScaling:
    """NTK-aware rotary scaling by ``factor`` s (GTE's ``rope_scaling`` of type ``ntk``), for a
    head of D dimensions and base theta, pair i = 0 .. D/2 - 1:

    * fixed (``mixed_b`` None): the base grows to theta * s and every frequency is divided
      by s^(2/D): ``f_i = (theta * s) ** (-2i / D) / s ** (2 / D)``;
    * mixed (``mixed_b`` b): the base stays, and pair i's frequency is divided by
      ``lambda_i = exp(a * (i + 1) ** b)``, with ``a = ln(s) / (D/2) ** b`` (the slowest
      pair by s, the fastest by almost nothing).

    s = 1 leaves every frequency as it was."""

    factor: float
    mixed_b: float | None = None

    def inverse_frequencies(self, head_dim: int, theta: float, device: torch.device) -> Tensor:
        """The scaled ``(D/2,)`` float32 frequencies."""
        if self.mixed_b is None:
            grown = inverse_frequencies(head_dim, theta * self.factor, device=device)
            return grown / self.factor ** (2 / head_dim)
        pair = torch.arange(1, head_dim // 2 + 1, dtype=torch.float32, device=device)  # i + 1
        a = math.log(self.factor) / (head_dim / 2) ** self.mixed_b
        lam = torch.exp(a * pair**self.mixed_b)  # (D/2,)
        return inverse_frequencies(head_dim, theta, device=device) / lam

    def describe(self) -> str:
        mixed = "" if self.mixed_b is None else f", mixed b {self.mixed_b:g}"
        return f"NTK scaling x{self.factor:g}{mixed}"


@dataclass(frozen=True)
class LayerKind:
    """What a layer's attention does with positions: rotary base ``theta`` (None: no rotation),
    local ``window`` (query i sees key j when ``|i - j| <= window``; None: every key) and an
    NTK scaling of the rotation's frequencies (None: none). The tables are keyed by
    ``theta``: the kinds of one model that share a base share its scaling too."""

    theta: float | None
    window: int | None = None
    ntk: NtkScaling | None = None

    def describe(self) -> str:
        what = "global" if self.window is None else f"local (window {self.window})"
        if self.theta is None:
            return what
        scaled = "" if self.ntk is None else f", {self.ntk.describe()}"
        return f"{what}, rotary theta {self.theta:g}{scaled}"


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

    def _inv(self, kind: LayerKind, device: torch.device) -> Tensor:
        assert kind.theta is not None
        if kind.ntk is not None:
            return kind.ntk.inverse_frequencies(self.head_dim, kind.theta, device)  # (D/2,)
        return inverse_frequencies(self.head_dim, kind.theta, device=device)  # (D/2,)

    def padded(self, kinds: list[LayerKind], length: int, device: torch.device) -> dict:
        """``theta -> Rotation`` for positions ``0..length-1``."""
        pos = torch.arange(length, device=device)
        return {
            k.theta: rotation_for_positions(pos, self._inv(k, device), k.theta)
            for k in kinds
            if k.theta is not None
        }

    def packed(self, kinds: list[LayerKind], positions: Tensor) -> dict[float, Rotation]:
        """``theta -> Rotation`` for packed ``positions`` ``(T,)``."""
        dev = positions.device
        return {
            k.theta: rotation_for_packed(positions, self._inv(k, dev), k.theta)
            for k in kinds
            if k.theta is not None
        }
