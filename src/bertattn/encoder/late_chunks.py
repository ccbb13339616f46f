"""Late chunking: one embedding per character span of a text, from one forward of the whole text.

A chunk embedded on its own sees only its own words; a chunk pooled from the token states of the
whole text sees the text around it ("it" knows what it refers to). :func:`encode_late_chunks`
runs the text once, then pools, for each span, the tokens whose first character lies in it
(the first that is not a space: see :func:`first_characters`).

A text longer than the model's window is run as overlapping windows of the model's length
(each with its own [CLS] and [SEP]), consecutive windows sharing ``overlap`` tokens, the last
window ending at the text's end. Each token's state is taken from the window where it has the
most context on both sides: the window that maximizes ``min(tokens before it, tokens after it)``
within the window (the earlier window on a tie), so a token near a window's edge is read from
the window that has it nearer the middle. With the default overlap (half a window) every token
but those near the text's two ends has at least a quarter window of context on each side.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, check_bool, check_int, check_str, describe

if TYPE_CHECKING:
    from .pipeline import Bert

logger = logging.getLogger("bertattn.encoder")

__all__ = [
    "TokenWindows",
    "WindowPlan",
    "check_spans",
    "encode_late_chunks",
    "first_characters",
    "gather_states",
    "late_options",
    "plan_text",
    "plan_windows",
    "pool_spans",
    "span_members",
]

#: far more tokens than any text: the whole text in one encoding (no truncation)
_WHOLE = 2**31 - 1


def check_spans(spans: object, text: str) -> list[tuple[int, int]]:
    """``spans`` as a list of ``(start, end)`` ints with ``0 <= start < end <= len(text)``,
    starts in order (non-decreasing; spans may overlap). Anything else raises
    :class:`ArgumentTypeError` (a wrong type) or ``ValueError`` naming the span."""
    if isinstance(spans, (str, bytes)) or not isinstance(spans, (Sequence, np.ndarray)):
        raise ArgumentTypeError(
            f"spans must be a list of (start, end) character offsets into the text, got "
            f"{describe(spans)}; pass e.g. [(0, 120), (120, 240)]."
        )
    if len(spans) == 0:
        raise ValueError(
            "spans is empty: give at least one (start, end) span of the text, e.g. "
            f"[(0, {len(text)})] for the whole text."
        )
    out: list[tuple[int, int]] = []
    n = len(text)
    for i, span in enumerate(spans):
        if isinstance(span, (str, bytes)) or not isinstance(span, (Sequence, np.ndarray)):
            raise ArgumentTypeError(
                f"spans[{i}] must be a (start, end) pair of ints, got {describe(span)}."
            )
        if len(span) != 2:
            raise ValueError(
                f"spans[{i}] has {len(span)} values, {list(span)!r}: a span is (start, end)."
            )
        start = check_int(span[0], f"spans[{i}] start")
        end = check_int(span[1], f"spans[{i}] end")
        assert start is not None and end is not None
        if not 0 <= start < end <= n:
            raise ValueError(
                f"spans[{i}] = ({start}, {end}) is out of range: a span needs "
                f"0 <= start < end <= {n} (the text's length in characters); end is exclusive."
            )
        if out and start < out[-1][0]:
            raise ValueError(
                f"spans[{i}] = ({start}, {end}) starts before spans[{i - 1}] = "
                f"{out[-1]}: spans must be in order of their start; sort them."
            )
        out.append((start, end))
    return out


def plan_windows(n: int, width: int, overlap: int) -> list[int]:
    """The start (token index) of each window of ``width`` tokens over ``n`` tokens,
    consecutive windows sharing ``overlap`` tokens, the last ending at ``n``."""
    if n <= width:
        return [0]
    step = width - overlap
    starts = list(range(0, n - width, step))
    starts.append(n - width)
    return starts


def best_window(starts: Sequence[int], width: int, n: int) -> np.ndarray:
    """``(n,)`` the index of the window each token is read from: the one where its context,
    ``min(before, after)`` inside the window, is largest (the earlier on a tie)."""
    pos = np.arange(n)[None, :]  # (1, n)
    s = np.asarray(starts)[:, None]  # (W, 1)
    inside = (pos >= s) & (pos < s + width)  # (W, n)
    context = np.minimum(pos - s, s + width - 1 - pos)  # (W, n)
    context = np.where(inside, context, -1)
    return context.argmax(0)  # the first maximum: the earlier window


def first_characters(text: str, offsets: np.ndarray) -> np.ndarray:
    """``(n,)`` where each token's word starts: its first character that is not a space,
    looking on past the token when it is all space. A SentencePiece piece such as ``▁It``,
    or a lone ``▁`` before its word, covers the space before the word and belongs with the
    word, not with the chunk that ends at the space."""
    out = offsets[:, 0].copy()
    n = len(text)
    for i, a in enumerate(out.tolist()):
        while a < n and text[a].isspace():
            a += 1
        out[i] = a
    return out


@dataclass
class TokenWindows:
    """A text's token states. ``states``: ``(n, E)`` float32, one row per token of the text
    (no special tokens); ``offsets``: ``(n, 2)`` character offsets; ``starts``: the windows'
    first tokens (one window: ``[0]``)."""

    states: Tensor
    offsets: np.ndarray
    starts: list[int]


@dataclass
class WindowPlan:
    """A text's windows, tokenized and not yet run: ``rows`` ``(W, L)`` token ids and
    ``kinds`` ``(W, L)`` token type ids (each window with the text's leading and trailing
    special tokens), ``head``: how many leading special tokens, ``width``: the text's tokens
    per window, ``n``: the text's tokens, ``offsets`` ``(n, 2)``, ``starts``: each window's
    first token of the text."""

    rows: np.ndarray
    kinds: np.ndarray
    head: int
    width: int
    n: int
    offsets: np.ndarray
    starts: list[int]


def plan_text(bert: Bert, text: str, *, max_length: int | None, overlap: int | None) -> WindowPlan:
    """Tokenize ``text`` whole and lay out its windows of ``max_length`` tokens (default
    ``bert.max_length``) sharing ``overlap`` tokens (default half a window); one window when
    it fits. Raises ``ValueError`` for a text with no tokens or options that cannot work."""
    with warnings.catch_warnings():  # the whole text: nothing is truncated, say nothing of it
        warnings.simplefilter("ignore")
        whole = bert.tokenizer.encode_windows(text, max_length=_WHOLE, stride=0)[0]
    special = np.asarray(whole.special_tokens_mask, dtype=bool)
    real = np.flatnonzero(~special)
    if len(real) == 0:
        raise ValueError("the text gives no tokens (it is empty or only spaces).")
    first, last = int(real[0]), int(real[-1])
    ids = np.asarray(whole.ids, dtype=np.int64)
    if not (special[:first].all() and special[last + 1 :].all() and not special[first:last].any()):
        raise ValueError(
            "the tokenizer put special tokens inside the text; late chunking needs the text's "
            "tokens between the leading and trailing special tokens only."
        )
    head, body, tail = ids[:first], ids[first : last + 1], ids[last + 1 :]  # (h,), (n,), (t,)
    types = np.asarray(whole.type_ids, dtype=np.int64)
    offsets = np.asarray(whole.offsets, dtype=np.int64)[first : last + 1]  # (n, 2)
    top = bert.model.config.max_position_embeddings
    limit = bert.max_length if max_length is None else max_length
    room = len(head) + len(tail) + 1
    limit = check_int(
        limit,
        "max_length",
        low=room,
        high=top,
        why=f"the special tokens and a token of the text; the model takes {top} positions",
    )
    assert limit is not None
    width = limit - len(head) - len(tail)  # tokens of the text a window holds
    overlap = width // 2 if overlap is None else overlap
    overlap = check_int(
        overlap,
        "overlap",
        low=0,
        high=width - 1,
        why=f"a window holds {width} of the text's tokens",
    )
    assert overlap is not None
    n = len(body)
    starts = plan_windows(n, width, overlap)
    w = min(width, n)
    rows = np.stack([np.concatenate([head, body[s : s + w], tail]) for s in starts])  # (W, L)
    kinds = np.zeros_like(rows)
    kinds[:, : len(head)] = types[:first]
    kinds[:, len(head) + w :] = types[last + 1 :]
    return WindowPlan(rows, kinds, len(head), w, n, offsets, starts)


def gather_states(plan: WindowPlan, windows: Tensor) -> TokenWindows:
    """``windows`` ``(W, L, E)``: the windows' last hidden states (special tokens included)
    -> each token's state from the window where it has the most context."""
    inner = windows[:, plan.head : plan.head + plan.width].float()  # (W, w, E)
    pick = torch.from_numpy(best_window(plan.starts, plan.width, plan.n))  # (n,)
    where = torch.arange(plan.n) - torch.tensor(plan.starts)[pick]  # (n,) place in its window
    states = inner[pick, where]  # (n, E)
    if len(plan.starts) > 1:
        logger.info(
            "late chunks: %d tokens in %d windows of %d", plan.n, len(plan.starts), plan.width
        )
    return TokenWindows(states, plan.offsets, plan.starts)


def token_states(
    bert: Bert, text: str, *, max_length: int | None, overlap: int | None, batch_size: int
) -> TokenWindows:
    """Every token of ``text`` through ``bert``: one forward when it fits ``max_length``
    (default ``bert.max_length``), else overlapping windows (see the module's docstring)."""
    plan = plan_text(bert, text, max_length=max_length, overlap=overlap)
    device = bert.model.device
    parts = []
    with torch.inference_mode():
        for i in range(0, len(plan.starts), batch_size):
            ids_t = torch.from_numpy(plan.rows[i : i + batch_size]).to(device)  # (b, L)
            mask = torch.ones_like(ids_t)
            kinds_t = torch.from_numpy(plan.kinds[i : i + batch_size]).to(device)  # (b, L)
            parts.append(bert._last_hidden(ids_t, mask, kinds_t).float().cpu())  # (b, L, E)
    return gather_states(plan, torch.cat(parts))


def late_options(
    bert: Bert,
    pooling: str | None,
    normalize: bool | None,
    truncate_dim: int | None,
) -> tuple[str, bool, int | None]:
    """``(pooling, normalize, truncate_dim)`` checked, the folder's where None; ``"cls"``
    and ``"lasttoken"`` refused (one state for the whole text says nothing per span)."""
    pooling = bert.pooling_for(pooling)
    if pooling in ("cls", "lasttoken"):
        state = "[CLS] state" if pooling == "cls" else "last-token state"
        raise ValueError(
            f"pooling {pooling!r} has one {state} for the whole text, not one per span: late "
            "chunking pools each span's own tokens; pass pooling='mean' (or 'max')."
        )
    normalize = check_bool(normalize, "normalize", optional=True)
    normalize = bert.normalize if normalize is None else normalize
    truncate_dim = bert.truncate_dim if truncate_dim is None else truncate_dim
    truncate_dim = check_int(truncate_dim, "truncate_dim", low=1, optional=True)
    return str(pooling), bool(normalize), truncate_dim


def span_members(text: str, offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """``(S, n)`` bool: the tokens whose first character lies in each checked span;
    ``ValueError`` naming the first span that holds none."""
    starts = first_characters(text, offsets)  # (n,)
    member = np.stack([(starts >= a) & (starts < b) for a, b in spans])  # (S, n)
    empty = np.flatnonzero(~member.any(1))
    if len(empty):
        i = int(empty[0])
        a, b = spans[i]
        raise ValueError(
            f"spans[{i}] = ({a}, {b}) holds no token's first character (text {text[a:b]!r}): "
            f"{len(empty)} of {len(spans)} spans have no tokens; widen or drop them."
        )
    return member


def pool_spans(
    text: str,
    tokens: TokenWindows,
    spans: list[tuple[int, int]],
    *,
    pooling: str,
    normalize: bool,
    truncate_dim: int | None,
) -> Tensor:
    """``(S, E)`` float32: each checked span's pooling over the tokens whose first character
    lies in it; ``ValueError`` naming the first span that holds none."""
    member = span_members(text, tokens.offsets, spans)  # (S, n)
    if pooling == "mean":
        weights = torch.from_numpy(member.astype(np.float32))  # (S, n)
        emb = (weights @ tokens.states) / weights.sum(1, keepdim=True)  # (S, E)
    else:  # max: each span's element-wise maximum
        emb = torch.stack([tokens.states[torch.from_numpy(m)].amax(0) for m in member])  # (S, E)
    if normalize:
        emb = torch.nn.functional.normalize(emb, p=2, dim=1)
    if truncate_dim is not None:
        emb = emb[:, :truncate_dim]
    return emb


def encode_late_chunks(
    bert: Bert,
    text: str,
    spans: object,
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    truncate_dim: int | None = None,
    max_length: int | None = None,
    overlap: int | None = None,
    batch_size: int = 32,
    convert_to_tensor: bool = False,
) -> Any:
    """See :meth:`bertattn.Bert.encode_late_chunks`."""
    check_str(text, "text")
    pooling, normalize, truncate_dim = late_options(bert, pooling, normalize, truncate_dim)
    batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
    check_bool(convert_to_tensor, "convert_to_tensor")
    checked = check_spans(spans, text)
    tokens = token_states(bert, text, max_length=max_length, overlap=overlap, batch_size=batch_size)
    emb = pool_spans(
        text, tokens, checked, pooling=pooling, normalize=normalize, truncate_dim=truncate_dim
    )
    return emb if convert_to_tensor else emb.numpy()
