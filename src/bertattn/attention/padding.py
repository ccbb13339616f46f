"""Pack and unpack padded batches: compute on real tokens only.

A padded batch ``(B, L, ...)`` with a key padding mask ``(B, L)`` (1 = real token) becomes a
packed ``(T, ...)`` tensor of its T real tokens, sequence after sequence, and back::

    packed = pack_padding_mask(key_padding_mask)   # once per encoder forward
    x_packed = unpad(x, packed)                    # (B, L, E) -> (T, E)
    ...                                            # every layer works on (T, E)
    x = pad(x_packed, packed)                      # (T, E) -> (B, L, E), zeros at padding

Real tokens need not be left-aligned: a sequence's real tokens keep their order, so attention
within a sequence sees the same keys as in the padded form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedBatch", "pack_padding_mask", "unpad", "pad"]


@dataclass(frozen=True)
class PackedBatch:
    """Where the real tokens of a padded batch are.

    Attributes:
        indices: ``(T,)`` int64, flat positions ``b * L + t`` of the real tokens, in order.
        cu_seqlens: ``(B + 1,)`` int32, cumulative lengths on the tensors' device;
            sequence ``b`` is ``packed[cu_seqlens[b] : cu_seqlens[b + 1]]``.
        offsets: the same cumulative lengths as Python ints (no device sync when slicing).
        max_seqlen: the longest sequence's length.
        batch: B.
        seq_len: L of the padded form.
    """

    indices: Tensor
    cu_seqlens: Tensor
    offsets: tuple[int, ...]
    max_seqlen: int
    batch: int
    seq_len: int

    @property
    def total(self) -> int:
        """T, the number of real tokens."""
        return self.offsets[-1]

    @property
    def pad_fraction(self) -> float:
        """Share of the padded batch that is padding (0 = none)."""
        size = self.batch * self.seq_len
        return 0.0 if size == 0 else 1.0 - self.total / size


def pack_padding_mask(key_padding_mask: Tensor) -> PackedBatch:
    """Build a :class:`PackedBatch` from a ``(B, L)`` mask, nonzero / True = real token."""
    if key_padding_mask.dim() != 2:
        raise ValueError(
            f"key_padding_mask has shape {tuple(key_padding_mask.shape)}; expected (batch, "
            f"seq_len) with 1 / True for a real token."
        )
    keep = key_padding_mask != 0  # (B, L)
    b, seq_len = keep.shape
    lengths = keep.sum(dim=1)  # (B,)
    indices = torch.nonzero(keep.reshape(-1), as_tuple=False).flatten()  # (T,)
    cu = torch.zeros(b + 1, dtype=torch.int32, device=keep.device)
    cu[1:] = torch.cumsum(lengths, 0)
    offsets = tuple(int(c) for c in cu.tolist())
    max_len = int(lengths.max()) if b else 0
    return PackedBatch(indices, cu, offsets, max_len, b, seq_len)


def unpad(x: Tensor, packed: PackedBatch) -> Tensor:
    """``(B, L, ...)`` -> ``(T, ...)``: the real tokens only."""
    return x.reshape(packed.batch * packed.seq_len, *x.shape[2:]).index_select(0, packed.indices)


def pad(x: Tensor, packed: PackedBatch) -> Tensor:
    """``(T, ...)`` -> ``(B, L, ...)`` with zeros at the padding positions."""
    out = x.new_zeros(packed.batch * packed.seq_len, *x.shape[1:])
    out.index_copy_(0, packed.indices, x)
    return out.view(packed.batch, packed.seq_len, *x.shape[1:])
