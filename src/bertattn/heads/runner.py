"""The batch loop every head shares: tokenized inputs sorted longest first, batched, run
through the encoder under ``inference_mode`` and the thread governor, and a head ``step``
applied to each batch's hidden states; results back in input order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from ..bert.pooling import length_batches

__all__ = ["run_head"]

#: ``step(hidden (B, L, E), mask (B, L)) -> (B, ...)`` float32 rows of one batch
Step = Callable[[Tensor, Tensor], Tensor]


def run_head(
    bert: Any,
    encodings: Sequence[Any],
    step: Step,
    *,
    batch_size: int,
    show_progress_bar: bool = False,
) -> list[Tensor]:
    """``step`` over every input of ``encodings`` (from ``bert.tokenizer.encode_batch``): one
    CPU row per input, in input order. The longest inputs go first, ``batch_size`` at a time
    (little padding; the encoder packs the real tokens on the CPU)."""
    from tqdm import tqdm

    order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
    lengths = [len(encodings[i].ids) for i in order]
    ranges = length_batches(lengths, batch_size)
    out: list[Tensor | None] = [None] * len(encodings)
    governor = bert.governor if bert.device.type == "cpu" else None
    bar = tqdm(total=len(ranges), desc="Batches", disable=not show_progress_bar)
    with torch.inference_mode(), bar, governor.loop() if governor else nullcontext():
        for start, end in ranges:
            idx = order[start:end]
            timed = governor.batch(sum(lengths[start:end])) if governor else nullcontext()
            with timed:
                _, mask, hidden = bert._forward([encodings[i] for i in idx])  # (B, L, E)
                rows = step(hidden, mask).float().cpu()  # (B, ...)
            for j, i in enumerate(idx):
                out[i] = rows[j]
            bar.update(1)
    return out  # type: ignore[return-value]
