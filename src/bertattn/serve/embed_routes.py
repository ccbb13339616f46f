"""The embedding routes: ``POST /v1/embeddings`` and ``/embeddings`` (OpenAI), ``/embed``
(TEI) and ``/tokenize`` (every kind of model), on the model's batcher. Bodies:
:mod:`.bodies`."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .bodies import EmbedRequest, check_openai, check_tei, check_tokenize, request_timeout
from .encoding import dumps
from .handling import checked, json_response, read_body, run_model
from .tokens import from_ids, token_pieces, tokenize

if TYPE_CHECKING:
    from .state import ServeState

logger = logging.getLogger("bertattn.serve")

__all__ = ["embed_tei", "embeddings", "tokenize_texts"]

#: responses of at most this many floats are serialized on the event loop (~0.1 ms with orjson)
_INLINE_FLOATS = 16384
#: token ids in one request above which their conversion runs off the event loop
_INLINE_IDS = 65536


async def _embed(
    state: ServeState, request: Request, req: EmbedRequest, param: str
) -> tuple[np.ndarray, int]:
    """``(N, E)`` float32 rows of the model step (pooled, not yet normalized), in input order,
    and the real tokens they hold."""
    limits = state.limits
    request_timeout(request.headers.get("x-request-timeout"))  # a bad header: 400 first
    truncate = limits.truncate if req.truncate is None else req.truncate
    if req.texts is not None:
        if logger.isEnabledFor(logging.DEBUG):  # texts only at -vv, never at -v
            logger.debug("texts (first 8 of %d): %r", len(req.texts), req.texts[:8])
        encodings, counts = await state.tokenize(
            tokenize, req.texts, state.max_input_tokens, truncate, param
        )
    elif sum(map(len, req.ids or [])) > _INLINE_IDS:
        encodings, counts = await run_in_threadpool(
            from_ids, req.ids or [], state.max_input_tokens, param
        )
    else:
        encodings, counts = from_ids(req.ids or [], state.max_input_tokens, param)
    rows = await run_model(state, request, encodings, counts, param)
    return rows, int(sum(counts))


def _finish(state: ServeState, rows: np.ndarray, normalize: bool, dimensions: int | None):
    """Rows as :meth:`Bert.encode` gives them: normalized as asked, cut to the folder's
    ``truncate_dim``; ``dimensions``: cut further and normalized again when normalizing.
    NumPy, not torch: on the event loop a torch call costs more than the arithmetic."""
    emb = rows  # (N, E) float32
    if normalize:
        emb = _unit(emb)
    if state.bert.truncate_dim is not None:
        emb = emb[:, : state.bert.truncate_dim]
    if dimensions is not None and dimensions < emb.shape[1]:
        emb = emb[:, :dimensions]
        if normalize:
            emb = _unit(emb)
    return np.ascontiguousarray(emb, dtype=np.float32)  # (N, E') float32


def _unit(rows: np.ndarray) -> np.ndarray:
    """``(N, E)`` rows over their L2 norms (at least 1e-12, as torch's ``normalize``)."""
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))[:, None]  # (N, 1)
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)


def _openai_body(state: ServeState, emb: np.ndarray, b64: bool, tokens: int) -> bytes:
    if b64:
        little = emb.astype("<f4", copy=False)
        items: Any = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        items = list(emb)  # (E,) float32 rows
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return dumps({"object": "list", "data": data, "model": state.names[0], "usage": usage})


async def _serialize(
    state: ServeState, size: int, fn: Callable[..., bytes], *args: Any
) -> Response:
    """``fn(*args)`` as the 200 response: on the event loop when the rows hold at most
    ``_INLINE_FLOATS`` floats (``size``), else on a worker thread."""
    start = time.perf_counter()
    body = fn(*args) if size <= _INLINE_FLOATS else await run_in_threadpool(fn, *args)
    state.metrics.stage.observe(time.perf_counter() - start, "serialization")
    return Response(body, 200, media_type="application/json")


async def embeddings(state: ServeState, request: Request) -> Response:
    obj = await read_body(state, request)
    req = await checked(
        request,
        check_openai,
        obj,
        names=state.names,
        width=state.width,
        limit=state.limits.max_request_inputs,
        vocab=state.vocab,
    )
    rows, tokens = await _embed(state, request, req, "input")
    emb = _finish(state, rows, state.bert.normalize, req.dimensions)
    return await _serialize(state, emb.size, _openai_body, state, emb, req.base64, tokens)


async def embed_tei(state: ServeState, request: Request) -> Response:
    obj = await read_body(state, request)
    req = await checked(
        request, check_tei, obj, width=state.width, limit=state.limits.max_request_inputs
    )
    rows, _ = await _embed(state, request, req, "inputs")
    emb = _finish(state, rows, bool(req.normalize), req.dimensions)
    return await _serialize(state, emb.size, dumps, list(emb))


async def tokenize_texts(state: ServeState, request: Request) -> Response:
    obj = await read_body(state, request)
    req, special = await checked(
        request, check_tokenize, obj, limit=state.limits.max_request_inputs
    )
    pieces = await state.tokenize(token_pieces, req.texts, state.max_input_tokens, special)
    return json_response(pieces)
