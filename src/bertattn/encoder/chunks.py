"""Row chunks for a large CPU batch: the same forward, a few thousand tokens at a time.

A batch of long texts makes every activation large: 32 paragraphs of 256 tokens are 8,192
rows, and the feed-forward block's ``(T, I)`` tensor of MiniLM is 50 MB in float32. glibc's
``malloc`` serves a block above its mmap threshold (at most 32 MiB) with fresh pages from the
kernel on every call, each page faulted and zeroed on first touch, and the passes that follow
(bias, GELU, residual, LayerNorm) stream from main memory instead of the cache. Measured on a
2-core Xeon with AMX (MiniLM, 40 paragraphs, ~10,000 tokens): float32 35 texts/s in one batch,
44 in chunks of 1,024 tokens; bfloat16 96 and 120 (chunks of 2,048). With glibc's thresholds
raised by hand (``MALLOC_MMAP_THRESHOLD_``) the one float32 batch ran at 42-44, so both the
page faults and the cache count.

So, on the CPU in inference, :meth:`bertattn.encoder.model.BertModel.forward` runs a batch of
more than :func:`chunk_tokens` tokens as consecutive chunks of rows and concatenates their
outputs along the batch. Each row is computed as it would be alone in a smaller batch: the
outputs are those of the whole batch up to float32 rounding (a GEMM's blocking may differ with
its row count). Shapes: every per-row input ``(B, L[, E])`` is cut into ``(b_i, L[, E])``;
every output ``(B, ...)`` is the concatenation of the chunks' ``(b_i, ...)``.

With two or more intra-op threads the chunks run side by side on chunk workers
(:mod:`bertattn.runtime.workers`); :func:`plan_chunks` then cuts them to equal token counts, a
multiple of the workers, and splits a batch within the budget into one piece per worker. Where
contiguous ranges cannot be even (a batch sorted by length, with a few long rows), the rows are
regrouped by their cost (:func:`regroup_rows`) and put back in order after. Measured on the
batches a saturated server formed (2-core AMD EPYC, MiniLM float32, short queries with a fifth
paragraphs, replayed in process): the chunk workers busy 92% of the batch time before, 96-98%
after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "CHUNK_BYTES",
    "MIN_PIECE_TOKENS",
    "balanced_chunks",
    "chunk_tokens",
    "concat_outputs",
    "concat_rows",
    "more_chunks_than_workers",
    "plan_chunks",
    "regroup_rows",
    "row_chunks",
    "row_costs",
]

#: the most bytes one chunk's widest activation, ``(T, max(3E, I))`` in the compute dtype, may
#: take: well under glibc's largest mmap threshold (32 MiB), so that it is served from the heap,
#: and small enough for the passes between the products to find it in the cache
CHUNK_BYTES = 8 << 20

#: the fewest real tokens a chunk split off for a chunk worker (:mod:`bertattn.runtime.workers`)
#: holds: a batch of 32 short texts (~600 tokens) is two pieces, a batch of 8 not split
MIN_PIECE_TOKENS = 256


def chunk_tokens(hidden_size: int, intermediate_size: int, itemsize: int = 4) -> int:
    """Tokens per chunk: the largest power of two whose widest activation fits in
    :data:`CHUNK_BYTES` (at least 256). MiniLM (E 384, I 1536): 1,024 in float32, 2,048 in
    bfloat16; BERT-base (E 768, I 3072): 512 and 1,024. Measured on MiniLM paragraphs (2-core
    AMX Xeon, texts/s, whole batch / 1,024 / 2,048 / 4,096 tokens): float32 35 / 44 / 42 / 39,
    bfloat16 96 / 111 / 120 / 118."""
    width = max(3 * hidden_size, intermediate_size, 1)
    fit = max(CHUNK_BYTES // (width * max(itemsize, 1)), 256)
    return 1 << (fit.bit_length() - 1)


def row_chunks(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """``(start, end)`` row ranges, in order, each holding at most ``budget`` tokens by
    ``lengths`` (a row longer than the budget is a chunk of its own); one range when all fit."""
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and total + n > budget:
            out.append((start, i))
            start, total = i, 0
        total += n
    if lengths:
        out.append((start, len(lengths)))
    return out


def balanced_chunks(lengths: Sequence[int], pieces: int) -> list[tuple[int, int]]:
    """``(start, end)`` row ranges, in order, about ``pieces`` of them with about equal tokens:
    each cut at the row boundary nearest to its share of the total (never an empty range)."""
    total, b = sum(lengths), len(lengths)
    cuts, seen, row = [0], 0, 0
    for i in range(1, pieces):
        goal = total * i / pieces
        while row < b and seen + lengths[row] / 2 < goal:  # rows mostly before the goal
            seen += lengths[row]
            row += 1
        if cuts[-1] < row < b:
            cuts.append(row)
    cuts.append(b)
    return [(s, e) for s, e in zip(cuts, cuts[1:], strict=False) if e > s]


def plan_chunks(
    lengths: Sequence[int], budget: int, workers: int = 1, min_piece: int | None = None
) -> list[tuple[int, int]]:
    """The row ranges a batch runs as: at most ``budget`` tokens each (0: one range, never
    split) and, for ``workers`` > 1, a multiple of the workers that can each get a piece of at
    least ``min_piece`` tokens (:data:`MIN_PIECE_TOKENS`), about equal, so that they finish
    together on a quiet machine."""
    min_piece = MIN_PIECE_TOKENS if min_piece is None else min_piece
    b, total = len(lengths), sum(lengths)
    if not budget or b < 2:
        return [(0, b)] if b else []
    pieces = -(-total // budget)
    fit = min(workers, b, total // max(min_piece, 1))
    if fit > 1:
        pieces = -(-max(pieces, fit) // fit) * fit
    pieces = min(pieces, b)
    if pieces < 2:
        return [(0, b)]
    out = balanced_chunks(lengths, pieces)
    if any(e - s > 1 and sum(lengths[s:e]) > budget for s, e in out):
        return row_chunks(lengths, budget)  # uneven rows: the budget first
    return out


def row_costs(lengths: Sequence[int], hidden_size: int, intermediate_size: int) -> list[float]:
    """Each row's compute, in token-equivalents: its ``n`` tokens through the products, plus
    its attention, which grows with ``n**2``. Per token and layer the products take
    ``2 (4 E**2 + 2 E I)`` flops and attention ``4 n E``, a ratio of ``n / (2E + I)``; the
    attention kernels run at about half the products' rate (MiniLM paragraphs: attention 15%
    of the time at ~11% of the flops), hence ``n (1 + 2n / (2E + I))``."""
    width = 2 * hidden_size + intermediate_size
    return [n * (1 + 2 * n / width) for n in lengths]


def regroup_rows(
    lengths: Sequence[int], costs: Sequence[float], plan: Sequence[tuple[int, int]], budget: int
) -> tuple[list[int], list[tuple[int, int]]] | None:
    """A row order that evens out ``plan``'s pieces, or None when contiguous ranges are even
    enough. Contiguous ranges of a batch sorted by length (a server's batch, shortest first)
    can only cut at a row: one long row more or less on a side is a large share of a small
    batch, and the piece that holds it finishes last while the other worker waits. Dealt out
    costliest first, each row to the lightest piece so far (longest processing time first),
    the pieces come within one short row of each other.

    Returns ``(order, ranges)``: the batch's rows in ``order`` (each piece's rows in their
    original order) cut by ``ranges`` gives as many pieces as ``plan``, their costliest at
    least 2% lighter than ``plan``'s, none of more than one row over ``budget`` tokens.
    ``lengths``: real tokens per row; ``costs``: their compute (:func:`row_costs`)."""
    pieces = len(plan)
    if pieces < 2:
        return None
    loads = [0.0] * pieces
    groups: list[list[int]] = [[] for _ in range(pieces)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        j = min(range(pieces), key=loads.__getitem__)
        groups[j].append(i)
        loads[j] += costs[i]
    before = max(sum(costs[s:e]) for s, e in plan)
    if max(loads) > 0.98 * before or any(not g for g in groups):
        return None
    if any(len(g) > 1 and sum(lengths[i] for i in g) > budget for g in groups):
        return None
    order: list[int] = []
    ranges: list[tuple[int, int]] = []
    for g in groups:
        ranges.append((len(order), len(order) + len(g)))
        order.extend(sorted(g))
    return order, ranges


def more_chunks_than_workers(tokens: int, budget: int, workers: int) -> bool:
    """Whether :func:`plan_chunks` gives a batch of ``tokens`` real tokens at least two chunks
    per worker (the budget alone asks for more chunks than workers), so that the workers can
    rebalance when one of them is slowed; a batch cut one piece per worker cannot."""
    return bool(budget) and workers >= 2 and -(-tokens // budget) > workers


def concat_rows(parts: Sequence[Tensor | None], order: Tensor | None = None) -> Tensor | None:
    """The chunks' tensors joined along the batch (None when the chunks gave None). With
    ``order`` (the ``(B,)`` row order the chunks were cut from, :func:`regroup_rows`), each
    chunk's rows go back to their places in the batch."""
    if parts[0] is None:
        return None
    if order is None:
        return torch.cat(parts, dim=0)  # type: ignore[arg-type]
    first: Tensor = parts[0]  # type: ignore[assignment]
    out = first.new_empty((len(order), *first.shape[1:]))
    start = 0
    for part in parts:
        n = part.shape[0]  # type: ignore[union-attr]
        out.index_copy_(0, order[start : start + n], part)  # type: ignore[arg-type]
        start += n
    return out


def concat_outputs(parts: Sequence[Any], order: Tensor | None = None) -> Any:
    """The chunks' outputs (dataclasses of the same type, e.g. ``BertModelOutput``) as one:
    each tensor field joined along the batch, each tuple field (one tensor or None per layer)
    joined layer by layer, None kept None; rows put back by ``order`` (:func:`concat_rows`)."""
    joined = {}
    for f in dataclasses.fields(parts[0]):
        values = [getattr(p, f.name) for p in parts]
        if isinstance(values[0], tuple):
            joined[f.name] = tuple(concat_rows(layer, order) for layer in zip(*values, strict=True))
        else:
            joined[f.name] = concat_rows(values, order)
    return type(parts[0])(**joined)
