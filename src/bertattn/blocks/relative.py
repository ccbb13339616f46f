"""MPNet's relative position bias, as transformers' ``MPNetEncoder`` computes it.

Every pair (query ``i``, key ``j``) of a sequence falls into one of 32 buckets by its relative
position ``j - i`` (T5's bidirectional scheme): half the buckets for keys before the query, half
for keys after; within each half, distances 0..7 get a bucket each and 8..127 share the other 8
on a log scale; 128 and beyond share the last one. One table ``(buckets, H)``, held once by the
encoder and shared by every layer, gives each head's bias for each bucket; the bias is added to
every layer's scores after the ``1/sqrt(D)`` scaling and before the softmax, like the mask::

    scores = q · k / sqrt(D) + table[bucket(j - i), h] + mask          (B, H, L, L)

transformers numbers ``i`` and ``j`` by their index in the padded batch (its position ids play
no part) and always computes 32 buckets with a maximum distance of 128, whatever the config's
``relative_attention_num_buckets`` says (a larger table's extra rows are never read).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..attention.padding import PackedBatch

__all__ = [
    "NUM_BUCKETS",
    "MAX_DISTANCE",
    "relative_position_bucket",
    "position_bias",
    "packed_position_bias",
]

#: the buckets transformers' ``MPNetEncoder.compute_position_bias`` computes
NUM_BUCKETS = 32
#: the distance from which every key shares the last bucket of its side
MAX_DISTANCE = 128


def relative_position_bucket(
    relative_position: Tensor, num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE
) -> Tensor:
    """The bucket of each relative position ``key - query`` (int64, any shape -> the same
    shape): transformers' ``MPNetEncoder.relative_position_bucket``, op for op (the log is
    taken in float32 as there, so the buckets agree at the boundaries too)."""
    ret = torch.zeros_like(relative_position)
    n = -relative_position
    num_buckets //= 2
    ret += (n < 0).to(torch.long) * num_buckets  # keys after the query: the upper half
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    ret += torch.where(is_small, n, val_if_large)
    return ret


def _bias(table: Tensor, positions: Tensor) -> Tensor:
    """``(1, H, l, l)``: the bias of every (query, key) pair of the tokens at ``positions``
    ``(l,)`` (their indices in the padded sequence)."""
    relative = positions[None, :] - positions[:, None]  # (l, l): key - query
    values = torch.nn.functional.embedding(relative_position_bucket(relative), table)  # (l, l, H)
    return values.permute(2, 0, 1).unsqueeze(0)  # (1, H, l, l)


def position_bias(table: Tensor, length: int, dtype: torch.dtype | None = None) -> Tensor:
    """The bias of a padded batch of ``length`` tokens: ``(1, H, L, L)`` (broadcast over the
    batch), from ``table`` ``(buckets, H)``, in ``dtype`` (the table's when None)."""
    positions = torch.arange(length, dtype=torch.long, device=table.device)  # (L,)
    out = _bias(table, positions)
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


def packed_position_bias(
    table: Tensor, packed: PackedBatch, dtype: torch.dtype | None = None
) -> tuple[Tensor | None, ...]:
    """The bias blocks of a packed batch, one ``(1, H, l_b, l_b)`` per sequence (None for a
    sequence of no token), each token numbered by its index in the padded sequence (as the
    padded path and transformers number them, so holes in a mask change nothing)."""
    positions = packed.indices % packed.seq_len  # (T,): each real token's index in its row
    offs = packed.offsets
    blocks: list[Tensor | None] = []
    for start, end in zip(offs[:-1], offs[1:], strict=True):
        if end == start:
            blocks.append(None)
            continue
        block = _bias(table, positions[start:end])
        blocks.append(block if dtype is None or block.dtype == dtype else block.to(dtype))
    return tuple(blocks)
