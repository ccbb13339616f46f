"""Rotary position embeddings: queries and keys turned by an angle that grows with the position.

Where BERT adds a learned position vector to every token before the first layer, a rotary model
(ModernBERT, GTE, NomicBERT, Jina v3) leaves the tokens alone and rotates, in every layer, each
pair of dimensions ``(i, i + D/2)`` of a query and of a key by the angle ``position * f_i``, with
``f_i = theta ** (-2i / D)``. The score ``q_m . k_n`` of two rotated vectors then depends on
their positions only through ``m - n``: attention sees relative positions, and nothing about
the absolute one.

The pairing is transformers' ``rotate_half`` convention (the first half of the head's
dimensions paired with the second half), computed in float32 whatever the compute dtype.

Shapes (D head size, H heads, L padded length, T packed tokens)::

    Rotation.cos, Rotation.sin: (L, D) for padded (B, H, L, D) queries,
                                (T, 1, D) for packed (T, H, D) ones
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Rotation",
    "apply_rotation",
    "inverse_frequencies",
    "rotate_half",
    "rotation_for_packed",
    "rotation_for_positions",
]


@dataclass(frozen=True)
class Rotation:
    """The cosines and sines of every position's angles, shaped to broadcast against the
    queries they turn (see the module docstring); float32. ``theta``: the base the angles were
    computed with (for ``explain()`` and the steps view)."""

    cos: Tensor
    sin: Tensor
    theta: float

    def describe(self) -> str:
        """One line for ``explain()``."""
        return f"rotary positions (theta {self.theta:g}, rotate_half pairs, float32)"


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> Tensor:
    """``f_i = theta ** (-2i / D)`` for ``i = 0 .. D/2 - 1``: ``(D/2,)`` float32."""
    if head_dim % 2:
        raise ValueError(
            f"rotary positions need an even head size, got {head_dim}; rotary models pair "
            f"dimension i with i + head_dim/2."
        )
    if not theta > 0:
        raise ValueError(f"rope_theta must be a positive number, got {theta!r}.")
    steps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device)
    return 1.0 / (theta ** (steps / head_dim))


def rotation_for_positions(positions: Tensor, inv_freq: Tensor, theta: float) -> Rotation:
    """The angles ``positions[..., None] * f``, each once for both dimensions of its pair:
    ``(..., D)`` cosines and sines (``positions``: any shape of integer positions)."""
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)  # (..., D/2)
    both = torch.cat((angles, angles), dim=-1)  # (..., D): pair (i, i + D/2) shares angle i
    return Rotation(both.cos(), both.sin(), float(theta))


def rotation_for_packed(positions: Tensor, inv_freq: Tensor, theta: float) -> Rotation:
    """For packed ``(T, H, D)`` queries: ``positions`` ``(T,)`` (each sequence from 0) ->
    ``(T, 1, D)`` tables."""
    rot = rotation_for_positions(positions, inv_freq, theta)
    return Rotation(rot.cos.unsqueeze(-2), rot.sin.unsqueeze(-2), rot.theta)


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the last dimension split in halves: the 90-degree turn of
    every pair ``(i, i + D/2)``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotation(q: Tensor, k: Tensor, rotation: Rotation) -> tuple[Tensor, Tensor]:
    """Queries and keys rotated by ``rotation`` (the same shapes and dtype as given).

    The steps, for one pair of dimensions ``(a, b) = (x_i, x_{i + D/2})`` at angle ``t``::

        a' = a cos t - b sin t
        b' = b cos t + a sin t

    which is ``x * cos + rotate_half(x) * sin`` for all pairs at once, computed here on the two
    halves directly (no ``rotate_half`` copy), in float32.
    """
    half = rotation.cos.shape[-1] // 2
    out = []
    for t in (q, k):
        work = torch.float64 if t.dtype == torch.float64 else torch.float32
        cos = rotation.cos[..., :half].to(work)  # each pair's angle once
        sin = rotation.sin[..., :half].to(work)
        x = t if t.dtype == work else t.to(work)
        a, b = x[..., :half], x[..., half:]
        if torch.is_grad_enabled() and x.requires_grad:  # the same, differentiable
            turned = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        else:  # into one buffer, no intermediate tensors
            turned = torch.empty(x.shape, dtype=work, device=x.device)
            first, second = turned[..., :half], turned[..., half:]
            torch.mul(a, cos, out=first)
            first.addcmul_(b, sin, value=-1.0)  # a' = a cos t - b sin t
            torch.mul(b, cos, out=second)
            second.addcmul_(a, sin)  # b' = b cos t + a sin t
        out.append(turned if turned.dtype == t.dtype else turned.to(t.dtype))
    return out[0], out[1]
