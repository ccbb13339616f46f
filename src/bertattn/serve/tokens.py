"""Texts and token ids into what the model step takes, with each input's real token count.

The functions that tokenize texts run under the server's tokenizer lock (the tokenizer's
truncation setting is state: one caller at a time), on the event loop for a small request and
on the tokenizer thread for a large one (:meth:`bertattn.serve.state.ServeState.tokenize`);
:func:`from_ids` needs no tokenizer and no lock. Texts are tokenized exactly as
:meth:`bertattn.Bert.encode` tokenizes them, so a server's rows equal ``encode``'s."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..encoder.tokenizer import InvalidTextError
from .errors import ApiError

__all__ = [
    "EMBED_FIX",
    "TRUNCATE_FIX",
    "TokenIds",
    "WindowTally",
    "from_ids",
    "token_pieces",
    "tokenize",
    "tokenize_inputs",
    "window_plans",
    "windows_of",
]


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


def _encode(
    bert: Any, texts: list[str], limit: int, param: str, pairs: list[str] | None = None
) -> list[Any]:
    """The encodings, each text (or pair) cut to ``limit`` tokens (a long text is cut before
    it is tokenized: :mod:`bertattn.encoder.budget`); a text that is not valid Unicode -> 400."""
    try:
        with warnings.catch_warnings():  # a truncation is the server's rule, not news
            warnings.simplefilter("ignore")
            return bert.tokenizer.encode_batch(texts, pairs, max_length=limit)
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


#: how an over-long input may be let through, by default (the embedding routes)
EMBED_FIX = "send 'truncate': true (POST /embed) / start the server with --truncate"
#: ... on the head routes whose bodies take ``truncate`` (TEI's /rerank, /predict, /embed_sparse)
TRUNCATE_FIX = "send 'truncate': true"


def tokenize(
    bert: Any,
    texts: list[str],
    limit: int,
    truncate: bool,
    param: str,
    fix: str = EMBED_FIX,
) -> tuple[list[Any], list[int]]:
    """``(encodings, real token counts)``, cut to ``limit`` tokens; with ``truncate`` off a
    longer input is refused (400) naming its index and its token count (or "more than
    :data:`COUNT_MOST`") and ``fix``, the route's way to let it through. A text holding a
    lone surrogate is refused (400, ``invalid_text``) naming its index and the character's
    position."""
    encodings = _encode(bert, texts, limit, param)
    if not truncate:
        over = next((i for i, e in enumerate(encodings) if e.overflowing), None)
        if over is not None:
            full = _length(bert, texts[over])
            raise ApiError(
                400,
                f"'{param}[{over}]' has {full} tokens, more than this server's limit of {limit} "
                f"(--max-input-tokens); shorten it, split it, or {fix}.",
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


def tokenize_inputs(
    bert: Any,
    inputs: list[str | tuple[str, str]],
    limit: int,
    truncate: bool,
    param: str,
    fix: str = TRUNCATE_FIX,
) -> tuple[list[Any], list[int]]:
    """:func:`tokenize` for inputs that are texts or ``(text, text)`` pairs (a pair is one
    input: ``[CLS] a [SEP] b [SEP]``, cut longest first), in input order; ``fix``: how the
    route lets an over-long input through."""
    singles = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    pairs = [i for i, x in enumerate(inputs) if not isinstance(x, str)]
    encodings: list[Any] = [None] * len(inputs)
    if singles:
        texts = [inputs[i] for i in singles]
        done, _ = tokenize(bert, texts, limit, truncate, param, fix)  # type: ignore[arg-type]
        for i, e in zip(singles, done, strict=True):
            encodings[i] = e
    if pairs:
        firsts = [inputs[i][0] for i in pairs]
        seconds = [inputs[i][1] for i in pairs]
        done = _encode(bert, firsts, limit, param, seconds)
        if not truncate:
            over = next((j for j, e in enumerate(done) if e.overflowing), None)
            if over is not None:
                raise ApiError(
                    400,
                    f"'{param}[{pairs[over]}]' is a pair longer than this server's limit of "
                    f"{limit} tokens (--max-input-tokens); shorten it, or {fix}.",
                    param=f"{param}[{pairs[over]}]",
                    code="input_too_long",
                )
        for i, e in zip(pairs, done, strict=True):
            encodings[i] = e
    return encodings, [len(e.ids) for e in encodings]


class WindowTally:
    """The tokens of one request's windows so far, against the most it may hold (a
    request's documents are planned in chunks: the tally runs across them)."""

    def __init__(self, most: int | None) -> None:
        self.most = most
        self.tokens = 0
        self.windows = 0
        self.documents = 0


def window_plans(
    bert: Any,
    pairs: list[tuple[str, str]],
    limit: int,
    window: int,
    param: str,
    tally: WindowTally,
    truncate: bool = True,
) -> list[Any]:
    """Per ``(query, document)`` pair, the plan of the document's overlapping windows of
    ``window`` tokens beside the query (:func:`bertattn.heads.windows.plan_windows`), reading
    at most ``limit`` x 64 of its tokens; counted, not built. The moment the request's windows
    (``tally``, across chunks) hold more than ``tally.most`` tokens (the server's
    ``--max-queue-tokens``) the request is refused (413): the cost is tokenizing the documents
    up to that point, never building windows that could not be run. ``truncate`` off: a
    document longer than the tokens read is refused (400), not scored on its start."""
    from ..heads.windows import plan_windows

    plans = []
    for i, (query, doc) in enumerate(pairs):
        try:
            plan = plan_windows(
                bert.tokenizer, query, doc, max_length=limit, doc_tokens=window,
                most_tokens=64 * limit,
            )  # fmt: skip
        except InvalidTextError:
            raise ApiError(
                400, f"'{param}[{i}]' holds a lone surrogate: it is not valid Unicode.",
                param=f"{param}[{i}]", code="invalid_text",
            ) from None  # fmt: skip
        if plan.cut and not truncate:
            raise ApiError(
                400,
                f"'{param}[{i}]' has more than {64 * limit} tokens, more than this server "
                f"reads of a document in windows (64 x --max-input-tokens {limit}), and this "
                f"server does not cut inputs (--no-truncate); shorten or split it.",
                param=f"{param}[{i}]",
                code="input_too_long",
            )
        tally.tokens += plan.tokens
        tally.windows += len(plan)
        tally.documents += 1
        if tally.most is not None and tally.tokens > tally.most:
            raise ApiError(
                413,
                f"the request's documents make more than {tally.most} tokens of windows "
                f"({tally.windows} windows of at most {window} document tokens each, "
                f"'max_tokens_per_doc', from its first {tally.documents} documents), more than "
                f"this server's queue can ever hold (--max-queue-tokens); raise "
                f"'max_tokens_per_doc', send fewer or shorter documents, or split the request.",
                param="max_tokens_per_doc",
                code="request_too_large",
            )
        plans.append(plan)
    return plans


def windows_of(bert: Any, plans: list[Any]) -> list[list[Any]]:
    """The windows of each plan (:func:`window_plans`), built."""
    from ..heads.windows import build_windows

    return [list(build_windows(bert.tokenizer, plan)) for plan in plans]
