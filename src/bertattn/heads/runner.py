"""The batch loop every head shares: tokenized inputs sorted longest first, batched, run
through the encoder under ``inference_mode`` and the thread governor, and a head ``step``
applied to each batch's hidden states; results back in input order."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from ..encoder.pooling import length_batches
from ..engine import ModelStep

__all__ = ["head_step", "run_head", "token_batches"]

#: ``step(hidden (B, L, E), mask (B, L)) -> (B, ...)`` float32 rows of one batch
Step = Callable[[Tensor, Tensor], Tensor]


def head_step(bert: Any, step: Step, kind: str) -> ModelStep:
    """The engine step (:mod:`bertattn.engine`) of a head: tokenized inputs through ``bert``
    (padded; packed inside on the CPU), then ``step`` on their hidden states."""

    def compute(encodings: Sequence[Any]) -> Tensor:
        _, mask, hidden = bert.forward_encodings(encodings)  # mask (B, L), hidden (B, L, E)
        return step(hidden, mask)

    return ModelStep(bert, compute, kind)


def _fill(bert: Any, batch_size: int, limit: int) -> int:
    """The padded tokens ``bert`` fills a batch of short inputs to (0: a stand-in encoder
    without :meth:`bertattn.Bert._fill_tokens`)."""
    fill = getattr(bert, "_fill_tokens", None)
    return fill(batch_size, limit) if callable(fill) else 0


def _longest_first(
    encodings: Sequence[Any], batch_size: int, fill: int
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """``(order, lengths, ranges)``: the inputs' indices longest first, their token counts in
    that order, and the :func:`length_batches` ranges over them."""
    order = sorted(range(len(encodings)), key=lambda i: -len(encodings[i].ids))
    lengths = [len(encodings[i].ids) for i in order]
    return order, lengths, length_batches(lengths, batch_size, None, fill)


def token_batches(
    bert: Any, texts: Sequence[str], batch_size: int, limit: int
) -> Iterator[tuple[list[int], list[Any]]]:
    """``(indices, encodings)`` of each batch of ``texts``, tokenized once by ``bert``'s
    tokenizer and cut at ``limit`` tokens (on purpose: the truncation warning is not
    raised), longest first, ``batch_size`` a batch and filled further with short ones on the
    CPU, as :meth:`bertattn.Bert.encode` batches (:meth:`bertattn.BertModel.fill_tokens`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".* were truncated")
        encodings = bert.tokenizer.encode_batch(list(texts), max_length=limit)
    order, _, ranges = _longest_first(encodings, batch_size, _fill(bert, batch_size, limit))
    for start, end in ranges:
        idx = order[start:end]
        yield idx, [encodings[i] for i in idx]


def run_head(
    bert: Any,
    encodings: Sequence[Any],
    step: Step,
    *,
    batch_size: int,
    show_progress_bar: bool = False,
    each: Callable[[Tensor], Sequence[Any]] | None = None,
    fill: bool = True,
) -> list[Any]:
    """``step`` over every input of ``encodings`` (from ``bert.tokenizer.encode_batch``): one
    CPU row per input, in input order. The longest inputs go first, ``batch_size`` at a time
    (little padding; the encoder packs the real tokens on the CPU), each batch through the
    head's engine step (inference mode, the thread governor: :func:`head_step`). ``each``:
    applied to each batch's ``(B, ...)`` rows as they come, one result per row kept instead of
    the row (a SPLADE row made sparse at once: memory holds one batch's dense rows, never
    the whole input's). On the CPU a batch of short inputs takes more than ``batch_size``,
    as :meth:`bertattn.Bert.encode` does (:meth:`bertattn.BertModel.fill_tokens`); ``fill``
    False keeps ``batch_size`` (a head whose step makes ``(tokens, V)`` vocabulary logits:
    its own product gives each row work enough, and a filled batch multiplies the logits'
    memory: 4,096 short tokens of SPLADE's are 500 MB of logits)."""
    from tqdm import tqdm

    tokens = _fill(bert, batch_size, bert.max_length) if fill else 0
    order, lengths, ranges = _longest_first(encodings, batch_size, tokens)
    out: list[Any] = [None] * len(encodings)
    engine = head_step(bert, step, "rows")
    bar = tqdm(total=len(ranges), desc="Batches", disable=not show_progress_bar)
    with engine.session(), bar:
        for start, end in ranges:
            idx = order[start:end]
            rows = engine([encodings[i] for i in idx], sum(lengths[start:end]))  # (B, ...)
            kept = list(torch.from_numpy(rows)) if each is None else each(torch.from_numpy(rows))
            for j, i in enumerate(idx):
                out[i] = kept[j]
            bar.update(1)
    return out  # type: ignore[return-value]
