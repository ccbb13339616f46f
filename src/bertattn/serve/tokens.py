"""Texts and token ids into what the model step takes, with each input's real token count.

Runs on the server's one tokenizer thread (the tokenizer's truncation setting is state: one
thread only). Texts are tokenized exactly as :meth:`bertattn.Bert.encode` tokenizes them, so a
server's rows equal ``encode``'s."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..bert.tokenizer import InvalidTextError
from .errors import ApiError

__all__ = ["TokenIds", "from_ids", "tokenize", "token_pieces"]


@dataclass
class TokenIds:
    """Token ids given by the client, in the shape ``BertTokenizer.pad`` reads."""

    ids: list[int]
    type_ids: list[int] = field(default_factory=list)
    tokens: tuple[str, ...] = ()
    overflowing: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not self.type_ids:
            self.type_ids = [0] * len(self.ids)


#: the most tokens counted to name an over-long input's length (``truncate: false``): a
#: longer one is "more than" this, so that a 10 MB input costs no more than this many tokens
COUNT_MOST = 32768


def _encode(bert: Any, texts: list[str], limit: int, param: str) -> list[Any]:
    """The encodings, each text cut to ``limit`` tokens (a long text is cut before it is
    tokenized: :mod:`bertattn.bert.budget`); a text that is not valid Unicode -> 400."""
    try:
        with warnings.catch_warnings():  # a truncation is the server's rule, not news
            warnings.simplefilter("ignore")
            return bert.tokenizer.encode_batch(texts, max_length=limit)
    except InvalidTextError as exc:
        raise ApiError(
            400,
            f"'{param}[{exc.index}]' holds a lone surrogate (U+{ord(exc.char):04X}) at "
            f"character {exc.position}: it is not valid Unicode (a \\u{ord(exc.char):04x} "
            f"escape without the other half of its pair); send the character's two halves "
            f"or drop it.",
            param=f"{param}[{exc.index}]",
            code="invalid_text",
        ) from None


def _length(bert: Any, text: str) -> str:
    """An over-long input's length in words: its token count, or "more than N" past
    :data:`COUNT_MOST` (counting further would cost what the limit is there to spare)."""
    count = bert.tokenizer.count_tokens(text, most=COUNT_MOST)
    return f"more than {COUNT_MOST}" if count is None else str(count)


def tokenize(
    bert: Any, texts: list[str], limit: int, truncate: bool, param: str
) -> tuple[list[Any], list[int]]:
    """``(encodings, real token counts)``, cut to ``limit`` tokens; with ``truncate`` off a
    longer input is refused (400) naming its index and its token count (or "more than
    :data:`COUNT_MOST`"). A text holding a lone surrogate is refused (400, ``invalid_text``)
    naming its index and the character's position."""
    encodings = _encode(bert, texts, limit, param)
    if not truncate:
        over = next((i for i, e in enumerate(encodings) if e.overflowing), None)
        if over is not None:
            full = _length(bert, texts[over])
            raise ApiError(
                400,
                f"'{param}[{over}]' has {full} tokens, more than this server's limit of {limit} "
                f"(--max-input-tokens); shorten it, split it, or send 'truncate': true "
                f"(POST /embed) / start the server with --truncate.",
                param=f"{param}[{over}]",
                code="input_too_long",
            )
    return encodings, [len(e.ids) for e in encodings]


def from_ids(ids: list[list[int]], limit: int, param: str) -> tuple[list[TokenIds], list[int]]:
    """Token-id inputs as given (the model sees them as they are: include [CLS] / [SEP], as
    ``POST /tokenize`` returns them); longer than ``limit`` -> 400 (ids are never cut)."""
    for i, row in enumerate(ids):
        if len(row) > limit:
            raise ApiError(
                400,
                f"'{param}[{i}]' has {len(row)} token ids, more than this server's limit of "
                f"{limit} (--max-input-tokens); token-id inputs are not truncated: shorten it.",
                param=f"{param}[{i}]",
                code="input_too_long",
            )
    return [TokenIds(list(row)) for row in ids], [len(row) for row in ids]


def token_pieces(bert: Any, texts: list[str], limit: int, special: bool) -> list[list[dict]]:
    """``POST /tokenize``: per text, its tokens as ``{id, text, special, start, stop}``
    (character offsets into the text), cut to ``limit`` as the model would see them."""
    out = []
    for enc in _encode(bert, texts, limit, "inputs"):  # POST /tokenize: TEI's field
        rows = []
        for tid, tok, sp, (start, stop) in zip(
            enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
        ):
            if sp and not special:
                continue
            rows.append({"id": tid, "text": tok, "special": bool(sp), "start": start, "stop": stop})
        out.append(rows)
    return out
