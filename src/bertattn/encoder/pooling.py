"""Pooling and length batching for :meth:`Bert.encode`: ``pool``, ``length_batches``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["EncodeStats", "length_batches", "pool"]


@dataclass
class EncodeStats:
    """What one :meth:`Bert.encode` call did. ``tokens``: real tokens; ``padded``: tokens in
    the padded batches (real + padding), so ``1 - tokens / padded`` is the padding ratio."""

    texts: int = 0
    empty: int = 0
    truncated: int = 0
    tokens: int = 0
    padded: int = 0


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """``(B, L, E)`` -> ``(B, E)``, over the positions where ``attention_mask`` is 1, as
    sentence-transformers' Pooling does: ``"mean"`` of them, their element-wise ``"max"``
    (masked positions set to -inf), ``"cls"``: the first of them ([CLS] unless a prompt
    is masked out), or ``"lasttoken"``: the last of them, wherever the padding is (a causal
    model's one state that has seen the whole text; zeros for a row with none)."""
    if pooling == "lasttoken":
        return _last_token(hidden, attention_mask)
    if pooling == "cls":
        if bool(attention_mask[:, 0].all()):
            return hidden[:, 0]
        first = attention_mask.to(torch.int).argmax(1)  # (B,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    if pooling == "max":
        keep = attention_mask.unsqueeze(-1).to(torch.bool)  # (B, L, 1)
        return hidden.masked_fill(~keep, float("-inf")).max(1).values
    m = attention_mask.unsqueeze(1).to(hidden.dtype)  # (B, 1, L)
    # a product over L instead of hidden * m: no (B, L, E) temporary (a padded server batch's
    # hidden states are tens of MB)
    total = torch.bmm(m, hidden).squeeze(1)  # (B, E)
    return total / m.sum(2).clamp(min=1e-9)  # (B, E)


def _last_token(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """``(B, L, E)`` -> ``(B, E)``: each row's state at its last position where
    ``attention_mask`` is 1 (right padding: its length - 1; left padding: L - 1)."""
    b, n = attention_mask.shape
    real = attention_mask.to(torch.bool)  # (B, L)
    last = n - 1 - real.flip(1).to(torch.int).argmax(1)  # (B,): the last real position
    rows = hidden[torch.arange(b, device=hidden.device), last]  # (B, E)
    return rows * real.any(1, keepdim=True).to(hidden.dtype)  # a row without tokens: zeros


def length_batches(
    lengths: Sequence[int],
    batch_size: int,
    batch_tokens: int | None = None,
    fill_tokens: int = 0,
) -> list[tuple[int, int]]:
    """``(start, end)`` ranges over texts sorted longest first: at most ``batch_size`` texts
    each (unless filled, below), and, when ``batch_tokens`` is set, at most that many tokens
    after padding (the first text of a range is its longest, so a range of n texts pads to
    ``n * lengths[start]``).

    ``fill_tokens``: a range of short texts takes more than ``batch_size`` of them while its
    padded tokens stay within this (still within ``batch_tokens``): a forward of 32 texts of
    11 tokens is too small to keep a CPU busy (:meth:`BertModel.fill_tokens` gives the count
    that does). 0: exactly ``batch_size`` texts a range (the last one fewer)."""
    out, start = [], 0
    while start < len(lengths):
        longest = max(lengths[start], 1)
        end = start + 1
        while end < len(lengths):
            padded = (end + 1 - start) * longest  # the range's tokens with one text more
            if batch_tokens is not None and padded > batch_tokens:
                break
            if end - start >= batch_size and padded > fill_tokens:
                break
            end += 1
        out.append((start, end))
        start = end
    return out
