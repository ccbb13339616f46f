"""Overlapping windows of a long document for a cross-encoder: the tokenizer's own pair
template around the query and each window (``[CLS] query [SEP] window [SEP]`` for BERT,
``<s> query </s></s> window </s>`` for RoBERTa / XLM-RoBERTa), each window a run of the
document's own tokens (never re-tokenized, so a word's pieces stay as they are in the whole
document).

The special tokens are read from the tokenizer's post-processor (a pair is encoded once and its
special tokens, their places and their token types are kept), never looked up by name, so every
family's template is the one its tokenizer writes.

:func:`plan_windows` says how many windows a document gives and their tokens without building
them, so that a caller can refuse a request too large to hold before paying for it (a server's
``max_tokens_per_doc: 1`` on thousands of documents)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

__all__ = ["PairTemplate", "WindowPlan", "pair_template", "pair_windows", "plan_windows"]


@dataclass(frozen=True)
class PairTemplate:
    """Where a tokenizer puts its special tokens around a pair ``a``, ``b``:
    ``prefix a middle b suffix``, each part a tuple of ``(token id, token type)``, and the
    token types of ``a``'s and ``b``'s own tokens."""

    prefix: tuple[tuple[int, int], ...]
    middle: tuple[tuple[int, int], ...]
    suffix: tuple[tuple[int, int], ...]
    first_type: int
    second_type: int

    @property
    def specials(self) -> int:
        """Special tokens the template adds to a pair."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)


_TEMPLATES: weakref.WeakKeyDictionary[Any, PairTemplate] = weakref.WeakKeyDictionary()


def pair_template(tokenizer: Any) -> PairTemplate:
    """The pair template of ``tokenizer`` (a :class:`bertattn.encoder.BertTokenizer`), read from
    one encoded pair: the tokens its post-processor marks special, before, between and after
    the two texts. Raises ``ValueError`` when its pair encoding has no such shape."""
    try:
        return _TEMPLATES[tokenizer]
    except (KeyError, TypeError):
        pass
    with warnings.catch_warnings():  # "a" / "b" may be unknown to a vocabulary: no news
        warnings.simplefilter("ignore")
        enc = tokenizer.encode_batch(["a"], ["b"], max_length=64)[0]
    parts: list[list[tuple[int, int]]] = [[], [], []]
    types: dict[int, int] = {}
    seen = -1  # the last text seen: 0 (a), 1 (b)
    for tid, ttype, special, seq in zip(
        enc.ids, enc.type_ids, enc.special_tokens_mask, enc.sequence_ids, strict=True
    ):
        if special or seq is None:
            parts[seen + 1].append((int(tid), int(ttype)))
        elif seq < seen:
            raise ValueError("the tokenizer's pair template puts the second text first.")
        else:
            seen = int(seq)
            types.setdefault(seen, int(ttype))
    if set(types) != {0, 1}:
        raise ValueError(
            "the tokenizer's post-processor does not encode text pairs (its pair encoding "
            "has no second text): a cross-encoder's windows need its pair template."
        )
    template = PairTemplate(tuple(parts[0]), tuple(parts[1]), tuple(parts[2]), types[0], types[1])
    try:
        _TEMPLATES[tokenizer] = template
    except TypeError:  # not weak-referenceable: read again next time
        pass
    return template


@dataclass(frozen=True)
class WindowPlan:
    """One document's windows before they are built: the query's ids (maybe cut), the
    document's ids, the window size and each window's start."""

    query: list[int]
    document: list[int]
    size: int
    starts: list[int]
    specials: int
    #: whether the document held more tokens than were read (``most_tokens``)
    cut: bool = False

    @property
    def tokens(self) -> int:
        """Tokens of all the windows together, specials included."""
        fixed = len(self.query) + self.specials
        return sum(fixed + len(self.document[s : s + self.size]) for s in self.starts)

    def __len__(self) -> int:
        return len(self.starts)


def window_starts(length: int, size: int) -> list[int]:
    """Starts of windows of ``size`` over ``length`` tokens, a quarter overlapping, the last
    ending at the end (one window at 0 for a short or empty document)."""
    step = max(1, size - size // 4)
    if length <= size:
        return [0]
    starts = list(range(0, length - size + step, step))
    if starts[-1] + size < length:
        starts.append(length - size)
    return [s for s in starts if s < length]


def plan_windows(
    tokenizer: Any,
    query: str,
    document: str,
    *,
    max_length: int,
    doc_tokens: int,
    most_tokens: int | None = None,
) -> WindowPlan:
    """The windows :func:`pair_windows` would build, counted, not built (the document is
    tokenized: at most ``most_tokens`` of its first tokens; ``cut`` says whether it held more)."""
    specials = pair_template(tokenizer).specials
    q = tokenizer.token_ids([query], most=max_length)[0]
    most = None if most_tokens is None else most_tokens + 1
    d = tokenizer.token_ids([document], most=most)[0]
    cut = most_tokens is not None and len(d) > most_tokens
    d = d[:most_tokens] if cut else d
    room = max_length - specials - len(q)
    if room < 1:
        q = q[: max(1, max_length // 2 - specials)]  # a query that fills the window: its start
        room = max_length - specials - len(q)
    size = max(1, min(doc_tokens, room))
    return WindowPlan(q, d, size, window_starts(len(d), size), specials, cut)


def build_windows(tokenizer: Any, plan: WindowPlan) -> Iterator[SimpleNamespace]:
    """The windows of ``plan``: encoding-like objects (``ids``, ``type_ids``, ``tokens``,
    ``overflowing``) for :meth:`bertattn.Bert.forward_encodings`."""
    t = pair_template(tokenizer)
    head = [i for i, _ in t.prefix] + plan.query + [i for i, _ in t.middle]
    head_types = (
        [k for _, k in t.prefix] + [t.first_type] * len(plan.query) + [k for _, k in t.middle]
    )
    tail, tail_types = [i for i, _ in t.suffix], [k for _, k in t.suffix]
    for s in plan.starts:
        piece = plan.document[s : s + plan.size]
        ids = [*head, *piece, *tail]
        types = [*head_types, *([t.second_type] * len(piece)), *tail_types]
        tokens = [tokenizer.id_to_token(i) for i in ids]
        yield SimpleNamespace(ids=ids, type_ids=types, tokens=tokens, overflowing=[])


def pair_windows(
    tokenizer: Any, query: str, document: str, **sizes: int | None
) -> list[SimpleNamespace]:
    """The windows of ``document`` for ``query`` (``sizes``: :func:`plan_windows`'s
    ``max_length``, ``doc_tokens`` and ``most_tokens``): at most ``doc_tokens`` document tokens
    each (and at most what ``max_length`` leaves beside the query and the template's special
    tokens), consecutive windows overlapping by a quarter, the last one ending at the
    document's end (``most_tokens``: only the document's first that many tokens are read). A
    short document is one window. Each is an encoding-like object (``ids``, ``type_ids``,
    ``tokens``, ``overflowing``) for :meth:`bertattn.Bert.forward_encodings`."""
    return list(build_windows(tokenizer, plan_windows(tokenizer, query, document, **sizes)))
