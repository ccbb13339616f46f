"""Overlapping windows of a long document for a cross-encoder: ``[CLS] query [SEP] window
[SEP]``, each window a run of the document's own tokens (never re-tokenized, so a word's pieces
stay as they are in the whole document)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["pair_windows"]


def pair_windows(
    tokenizer: Any,
    query: str,
    document: str,
    *,
    max_length: int,
    doc_tokens: int,
    most_tokens: int | None = None,
) -> list[SimpleNamespace]:
    """The windows of ``document`` for ``query``: at most ``doc_tokens`` document tokens each
    (and at most what ``max_length`` leaves beside the query), consecutive windows overlapping
    by a quarter, the last one ending at the document's end (``most_tokens``: only the
    document's first that many tokens are read). A short document is one window. Each is an
    encoding-like object (``ids``, ``type_ids``, ``tokens``, ``overflowing``) for
    :meth:`bertattn.Bert._forward`."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:
        raise ValueError("the vocabulary has no [CLS] / [SEP]: windows need them.")
    q = tokenizer.token_ids([query], most=max_length)[0]
    d = tokenizer.token_ids([document], most=most_tokens)[0]
    room = max_length - 3 - len(q)
    if room < 1:
        q = q[: max(1, max_length // 2 - 3)]  # a query that fills the window: its start
        room = max_length - 3 - len(q)
    size = max(1, min(doc_tokens, room))
    step = max(1, size - size // 4)
    starts = list(range(0, max(1, len(d) - size + step), step)) if d else [0]
    if d and starts[-1] + size < len(d):
        starts.append(len(d) - size)
    out = []
    for s in starts:
        piece = d[s : s + size]
        ids = [cls_id, *q, sep_id, *piece, sep_id]
        types = [0] * (len(q) + 2) + [1] * (len(piece) + 1)
        tokens = [tokenizer.id_to_token(i) for i in ids]
        out.append(SimpleNamespace(ids=ids, type_ids=types, tokens=tokens, overflowing=[]))
    return out
