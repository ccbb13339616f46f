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
from collections.abc import Iterable, Iterator, Sequence
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
    "pool_windows",
    "span_members",
]

#: far more tokens than any text: the whole text in one encoding (no truncation)
_WHOLE = 2**31 - 1

#: every character ``str.isspace()`` holds (all are below U+3001)
_SPACES = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)

#: the most float32 values :func:`pool_spans` gathers at once (64 MiB): spans are pooled in
#: groups of about this many (span, token) cells, so pooling's memory is bounded
_POOL_CELLS = 1 << 24


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
    ``min(before, after)`` inside the window, is largest (the earlier on a tie). Memory
    ``O(n + width)``, work ``O(windows x width)``: each window updates its own tokens only."""
    pick = np.zeros(n, dtype=np.int64)
    best = np.full(n, -1, dtype=np.int64)
    ramp = np.arange(width)
    context = np.minimum(ramp, width - 1 - ramp)  # (width,) a token's context at each place
    for w, start in enumerate(starts):
        end = min(start + width, n)
        here = context[: end - start]
        better = here > best[start:end]  # strictly: the earlier window keeps a tie
        best[start:end][better] = here[better]
        pick[start:end][better] = w
    return pick


def first_characters(text: str, offsets: np.ndarray) -> np.ndarray:
    """``(n,)`` where each token's word starts: its first character that is not a space,
    looking on past the token when it is all space. A SentencePiece piece such as ``▁It``,
    or a lone ``▁`` before its word, covers the space before the word and belongs with the
    word, not with the chunk that ends at the space."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")  # (len,)
    solid = np.flatnonzero(~np.isin(codes, _SPACES))  # the characters that are not space
    after = np.searchsorted(solid, offsets[:, 0])  # (n,) the first of them at or after each
    found = after < len(solid)
    return np.where(found, solid[np.minimum(after, len(solid) - 1)], len(text)).astype(np.int64)


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


def gather_states(plan: WindowPlan, windows: Iterable[Tensor | np.ndarray]) -> TokenWindows:
    """``windows``: each window's ``(L, E)`` last hidden states (special tokens included), in
    order (a ``(W, L, E)`` tensor, a list, or a generator) -> each token's state from the window
    where it has the most context. Each window is read once, in turn, and not kept: with a
    generator only the token states ``(n, E)`` and the window at hand are held."""
    pick = best_window(plan.starts, plan.width, plan.n)  # (n,)
    where = np.arange(plan.n) - np.asarray(plan.starts)[pick]  # (n,) place in its window
    order = np.argsort(pick, kind="stable")  # (n,) the tokens, window by window
    ends = np.cumsum(np.bincount(pick, minlength=len(plan.starts)))  # (W,)
    states: Tensor | None = None
    low = 0
    for w, window in enumerate(windows):
        rows = torch.as_tensor(window)  # (L, E)
        if states is None:
            states = torch.empty((plan.n, rows.shape[-1]), dtype=torch.float32)
        high = int(ends[w])
        mine = order[low:high]  # the tokens read from this window
        places = torch.from_numpy(plan.head + where[mine])
        states[torch.from_numpy(mine)] = rows[places].float()
        low = high
    assert states is not None and low == plan.n, "fewer windows than the plan"
    if len(plan.starts) > 1:
        logger.info(
            "late chunks: %d tokens in %d windows of %d", plan.n, len(plan.starts), plan.width
        )
    return TokenWindows(states, plan.offsets, plan.starts)


def _windows(bert: Bert, plan: WindowPlan, batch_size: int) -> Iterator[Tensor]:
    """The plan's windows through ``bert``, ``batch_size`` at a time, one ``(L, E)`` float32
    CPU tensor each (a batch is dropped once its windows are read)."""
    device = bert.model.device
    for i in range(0, len(plan.starts), batch_size):
        ids_t = torch.from_numpy(plan.rows[i : i + batch_size]).to(device)  # (b, L)
        mask = torch.ones_like(ids_t)
        kinds_t = torch.from_numpy(plan.kinds[i : i + batch_size]).to(device)  # (b, L)
        yield from bert._last_hidden(ids_t, mask, kinds_t).float().cpu()  # (b, L, E)


def token_states(
    bert: Bert, text: str, *, max_length: int | None, overlap: int | None, batch_size: int
) -> TokenWindows:
    """Every token of ``text`` through ``bert``: one forward when it fits ``max_length``
    (default ``bert.max_length``), else overlapping windows (see the module's docstring);
    memory: the token states and one batch of windows."""
    plan = plan_text(bert, text, max_length=max_length, overlap=overlap)
    with torch.inference_mode():
        return gather_states(plan, _windows(bert, plan, batch_size))


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


def span_members(
    text: str, offsets: np.ndarray, spans: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: the tokens whose first character lies in checked span ``i`` are
    ``order[bounds[i, 0] : bounds[i, 1]]`` (``order`` ``(n,)`` the token indices by where
    their word starts, ``bounds`` ``(S, 2)``); memory linear in the tokens and the spans.
    ``ValueError`` naming the first span that holds none."""
    starts = first_characters(text, offsets)  # (n,)
    order = np.argsort(starts, kind="stable")  # (n,) already sorted for every tokenizer seen
    ranked = starts[order]
    edges = np.asarray(spans, dtype=np.int64).reshape(-1, 2)  # (S, 2) characters
    bounds = np.searchsorted(ranked, edges)  # (S, 2) token ranks: [first char >= a, >= b)
    empty = np.flatnonzero(bounds[:, 1] <= bounds[:, 0])
    if len(empty):
        i = int(empty[0])
        a, b = spans[i]
        raise ValueError(
            f"spans[{i}] = ({a}, {b}) holds no token's first character (text {text[a:b]!r}): "
            f"{len(empty)} of {len(spans)} spans have no tokens; widen or drop them."
        )
    return order, bounds


def _pool_group(
    states: Tensor, order: np.ndarray, bounds: np.ndarray, out: Tensor, pooling: str
) -> None:
    """Pool the spans of ``bounds`` ``(G, 2)`` into ``out`` ``(G, E)`` (zeros for ``"mean"``:
    their sums; -inf for ``"max"``) with one gather and one segment reduction."""
    counts = bounds[:, 1] - bounds[:, 0]  # (G,)
    segment = np.repeat(np.arange(len(bounds)), counts)  # (P,) each cell's span
    offset = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    tokens = torch.from_numpy(order[np.repeat(bounds[:, 0], counts) + offset])  # (P,)
    rows = states.index_select(0, tokens)  # (P, E)
    index = torch.from_numpy(segment)
    if pooling == "mean":
        out.index_add_(0, index, rows)
    else:
        out.scatter_reduce_(0, index[:, None].expand_as(rows), rows, "amax")


def _pool(states: Tensor, order: np.ndarray, bounds: np.ndarray, pooling: str) -> Tensor:
    """``(S, E)``: each span's mean or max over its tokens (``order`` / ``bounds`` of
    :func:`span_members`), in groups of spans of about ``_POOL_CELLS`` values at once."""
    width = int(states.shape[1])
    fill = 0.0 if pooling == "mean" else float("-inf")
    out = torch.full((len(bounds), width), fill, dtype=states.dtype)  # (S, E)
    ends = np.cumsum(bounds[:, 1] - bounds[:, 0])  # (S,) cells up to each span's end
    cells = max(1, _POOL_CELLS // max(width, 1))
    first = 0
    while first < len(bounds):
        before = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, before + cells, side="right")))
        _pool_group(states, order, bounds[first:last], out[first:last], pooling)
        first = last
    if pooling == "mean":
        counts = torch.from_numpy(bounds[:, 1] - bounds[:, 0]).to(states.dtype)  # (S,)
        out /= counts[:, None]
    return out


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
    lies in it; ``ValueError`` naming the first span that holds none. Vectorized (no loop over
    the spans) and bounded: memory linear in the tokens and the spans."""
    order, bounds = span_members(text, tokens.offsets, spans)
    emb = _pool(tokens.states, order, bounds, pooling)
    if normalize:
        emb = torch.nn.functional.normalize(emb, p=2, dim=1)
    if truncate_dim is not None:
        emb = emb[:, :truncate_dim]
    return emb


def pool_windows(
    plan: WindowPlan,
    windows: Sequence[np.ndarray],
    text: str,
    spans: list[tuple[int, int]],
    *,
    pooling: str,
    normalize: bool,
    truncate_dim: int | None,
) -> np.ndarray:
    """``(S, E)`` float32: the spans pooled from a plan's computed ``windows`` (each
    ``(L, E)``), as :func:`encode_late_chunks`: :func:`gather_states` then :func:`pool_spans`.
    A server runs it off its event loop."""
    tokens = gather_states(plan, windows)  # W x (L, E) -> (n, E), no (W, L, E) copy
    return pool_spans(
        text, tokens, spans, pooling=pooling, normalize=normalize, truncate_dim=truncate_dim
    ).numpy()


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
    """Late chunking, as :meth:`bertattn.Bert.encode_late_chunks` (this function, ``bert``
    its ``self``): ``(S, E)`` float32, one row per span of ``text``, each pooled (the folder's
    pooling, or ``pooling="mean"`` / ``"max"``; ``"cls"`` and ``"lasttoken"`` are refused)
    over the tokens whose first character lies in the span, from one forward of the whole
    text, then normalized as the folder says (``normalize=`` overrides) and cut to
    ``truncate_dim``. ``spans``: ``(start, end)`` character offsets (end exclusive) in order
    of their start; they may overlap. A text longer than ``max_length`` (default
    ``bert.max_length``) runs as windows sharing ``overlap`` tokens (default half a window),
    each token's state from the window where it has the most context on both sides (see the
    module docstring). A span out of range, out of order or holding no token raises
    ``ValueError`` naming it. A NumPy array; ``convert_to_tensor``: a tensor."""
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
