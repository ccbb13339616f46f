"""The ASGI application: routes, authentication, admission, drain state.

:func:`create_app` ``(bert, **limits)`` returns a Starlette app; ``bertattn serve`` runs it in
uvicorn, and it can be mounted in any ASGI server. Data routes (``/v1/embeddings``, ``/embed``,
``/tokenize``, ``/v1/models``) and ``/info`` need the API key when one is set; probes
(``/live``, ``/ready``, ``/health``) and ``/metrics`` stay open.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..openmp import release_openmp_threads
from .access_log import AccessLog
from .batcher import Batcher
from .bodies import (
    EmbedRequest,
    check_openai,
    check_tei,
    check_tokenize,
    request_timeout,
)
from .encoding import dumps
from .errors import ApiError, clip, envelope
from .group import ServeGroup
from .handling import checked, json_response, read_body, run_model, unavailable
from .head_routes import HEAD_ROUTES
from .limits import Limits
from .served import ROUTES, model_names, serve_model
from .telemetry import ServeMetrics
from .token_routes import token_routes
from .tokens import from_ids, token_pieces, tokenize

logger = logging.getLogger("bertattn.serve")

__all__ = ["ServeState", "create_app"]

#: requests with at most this many characters of text are tokenized on the event loop (tens of
#: microseconds: less than handing them to the tokenizer thread and waking the loop again)
_INLINE_CHARS = 4096
#: responses of at most this many floats are serialized on the event loop (~0.1 ms with orjson)
_INLINE_FLOATS = 16384
#: a large request is tokenized in chunks of at most this many texts / characters, the lock given
#: up between chunks, so that a small request waits for one chunk, not the whole request
_CHUNK_TEXTS = 256
_CHUNK_CHARS = 64 << 10
#: token ids in one request above which their conversion runs off the event loop
_INLINE_IDS = 65536


class ServeState:
    """What the routes share: the model, the limits, the batcher, the metrics, and whether the
    server is ready (not draining, its worker alive). ``in_flight``: data requests being
    answered."""

    def __init__(self, model: Any, limits: Limits, metrics: ServeMetrics | None = None) -> None:
        #: the model's kind, its routes and its engine step (:mod:`.served`)
        self.served = serve_model(model)
        bert = self.bert = self.served.bert  # the encoder: tokenizer, limits, device
        self.limits = limits
        top = int(bert.max_length)
        limit = top if limits.max_input_tokens is None else limits.max_input_tokens
        if limit > top:
            raise ValueError(
                f"max_input_tokens {limit} is more than the model takes ({top} tokens): use "
                f"{top} or less."
            )
        if limit > limits.max_batch_tokens:
            raise ValueError(
                f"max_input_tokens {limit} is more than max_batch_tokens "
                f"{limits.max_batch_tokens}: one input must fit in a batch."
            )
        self.max_input_tokens = limit
        self.width = int(bert.get_embedding_dimension())
        self.vocab = int(bert.model.config.vocab_size)
        aliases = model_names(str(bert.name or "bertattn"))
        first = () if limits.served_name is None else (limits.served_name,)
        self.names = tuple(dict.fromkeys((*first, *aliases, *limits.names)))
        #: one server's counters (several models share one: ``metrics``)
        self.metrics = metrics or ServeMetrics(lambda: self.batcher.depth())
        self.batcher = Batcher(
            self.served.step,
            max_batch_tokens=limits.max_batch_tokens,
            max_queue_tokens=limits.max_queue_tokens,
            max_wait_s=limits.max_wait_s,
            max_queue_s=limits.max_queue_s,
            min_queue_requests=limits.min_queue_requests,
            metrics=self.metrics,
        )
        self.tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="bertattn-tokenize")
        #: held while the tokenizer runs: its truncation length is state, one caller at a time
        self.tokenizer_lock = threading.Lock()
        self.draining = False
        self.in_flight = 0
        self.started = time.time()
        self.stop_timeout: float | None = None  # the lifespan's end waits this long for the worker

    @property
    def ready(self) -> bool:
        return not self.draining and self.batcher.failed is None

    def drain(self) -> None:
        """Stop taking data requests (503) and say so on ``/ready``; in-flight ones finish."""
        self.draining = True

    async def tokenize(self, fn: Callable[..., Any], texts: list[str], *args: Any) -> Any:
        """``fn(bert, texts, *args)`` under the tokenizer lock: on the event loop for a small
        request when the lock is free, else on the tokenizer thread (a large request never
        holds up the loop) in chunks of at most ``_CHUNK_TEXTS`` texts / ``_CHUNK_CHARS``
        characters, one at a time, so that other requests' chunks run in between (one request
        does not hold the tokenizer for the others). ``fn`` returns a list, or a tuple of
        lists, per text; a 400 naming ``param[i]`` names the index in the whole request. Its
        time goes to the histogram."""
        start = time.perf_counter()
        try:
            if sum(map(_size, texts)) <= _INLINE_CHARS and self.tokenizer_lock.acquire(False):
                try:
                    return fn(self.bert, texts, *args)
                finally:
                    self.tokenizer_lock.release()
            loop = asyncio.get_running_loop()
            out: Any = None
            for first, chunk in _chunks(texts):
                try:
                    part = await loop.run_in_executor(
                        self.tokenizer_thread, self._locked, fn, chunk, *args
                    )
                except ApiError as exc:
                    raise _shifted(exc, first) from None
                if out is None:
                    out = part
                elif isinstance(out, tuple):
                    for whole, piece in zip(out, part, strict=True):
                        whole.extend(piece)
                else:
                    out.extend(part)
            return out
        finally:
            self.metrics.stage.observe(time.perf_counter() - start, "tokenization")

    def _locked(self, fn: Callable[..., Any], texts: list[str], *args: Any) -> Any:
        with self.tokenizer_lock:
            return fn(self.bert, texts, *args)


# ---------------------------------------------------------------------- helpers
def _size(text: str | tuple[str, ...]) -> int:
    """Characters of a text, or of a pair's texts together."""
    return len(text) if isinstance(text, str) else sum(map(len, text))


def _chunks(texts: list[str]) -> Iterator[tuple[int, list[str]]]:
    """``(index of the first, texts)`` of consecutive chunks of at most ``_CHUNK_TEXTS`` texts
    and ``_CHUNK_CHARS`` characters (a longer single text is a chunk by itself)."""
    start = chars = 0
    for i, text in enumerate(texts):
        if i > start and (i - start >= _CHUNK_TEXTS or chars + _size(text) > _CHUNK_CHARS):
            yield start, texts[start:i]
            start, chars = i, 0
        chars += _size(text)
    yield start, texts[start:]


def _shifted(exc: ApiError, by: int) -> ApiError:
    """``exc`` naming ``param[i]`` of a chunk as ``param[i + by]`` of the whole request."""
    match = None if exc.param is None else re.fullmatch(r"(.*)\[(\d+)\]", exc.param)
    if by and match:
        where = f"{match[1]}[{int(match[2]) + by}]"
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{where}'")
        exc.param = where
    return exc


def _error(exc: ApiError) -> Response:
    return json_response(exc.body(), exc.status, exc.headers)


def _check_key(state: ServeState, request: Request) -> None:
    key = state.limits.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "this server needs an API key: send 'Authorization: Bearer KEY'.",
            code="invalid_api_key",
            reason="unauthorized",
        )
    if not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(
            401, "the API key is not valid for this server.", code="invalid_api_key",
            reason="unauthorized",
        )  # fmt: skip


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


# ---------------------------------------------------------------------- routes
Handler = Callable[[ServeState, Request], Awaitable[Response]]


def _route(
    path: str, name: str, handler: Handler, *, data: bool, method: str = "GET", key: bool = False
) -> Route:
    """A route that counts its answers (the status the client gets), turns ApiError into the
    envelope, checks the key (``data`` or ``key``) and (``data``) the drain state and counts
    itself in flight. While the server drains, every answer says ``Connection: close``."""

    async def endpoint(request: Request) -> Response:
        serve = request.app.state.serve  # a ServeState, or a ServeGroup of several models
        state = serve
        status = 500
        counted = False
        try:
            try:
                if data or key:
                    _check_key(serve, request)
                if data and isinstance(serve, ServeGroup) and method == "POST":
                    state = await serve.pick(request, path, await read_body(serve, request))
                if data:
                    if state.batcher.failed is not None:
                        raise ApiError(
                            503,
                            "the model worker of this server has stopped (see its log); send "
                            "the request to another replica.",
                            code="worker_failed",
                        )
                    if not state.ready:
                        raise unavailable()
                    if not isinstance(state, ServeGroup):  # a group's is its models' sum
                        state.in_flight += 1
                        counted = True
                response = await handler(state, request)
            except ApiError as exc:
                response = _error(exc)
                if exc.status in (400, 401, 404, 408, 413, 415, 429, 499, 503, 504):
                    state.metrics.rejections.inc(exc.reason if exc.status != 400 else "invalid")
            if serve.draining:
                response.headers["connection"] = "close"
            status = response.status_code
            return response
        except asyncio.CancelledError:  # the server stops now: _CutShort answers 503
            status = 503
            raise
        finally:
            if counted:
                state.in_flight -= 1
            serve.metrics.requests.inc(name, str(status))

    return Route(path, endpoint, methods=[method], name=name)


async def _openai(state: ServeState, request: Request) -> Response:
    state.served.require("/v1/embeddings")
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


async def _tei(state: ServeState, request: Request) -> Response:
    state.served.require("/embed")
    obj = await read_body(state, request)
    req = await checked(
        request, check_tei, obj, width=state.width, limit=state.limits.max_request_inputs
    )
    rows, _ = await _embed(state, request, req, "inputs")
    emb = _finish(state, rows, bool(req.normalize), req.dimensions)
    return await _serialize(state, emb.size, dumps, list(emb))


async def _tokenize(state: ServeState, request: Request) -> Response:
    obj = await read_body(state, request)
    req, special = await checked(
        request, check_tokenize, obj, limit=state.limits.max_request_inputs
    )
    pieces = await state.tokenize(token_pieces, req.texts, state.max_input_tokens, special)
    return json_response(pieces)


async def _models(state: Any, request: Request) -> Response:
    created = int(state.started)
    served = state.states if isinstance(state, ServeGroup) else [state]
    data = [
        {"id": s.names[0], "object": "model", "created": created, "owned_by": "bertattn"}
        for s in served
    ]
    return json_response({"object": "list", "data": data})


async def _info(state: Any, request: Request) -> Response:
    if isinstance(state, ServeGroup):  # several models: each one's, in --model order
        infos = [json.loads((await _info(s, request)).body) for s in state.states]
        return json_response({"models": infos, "model_id": infos[0]["model_id"]})
    from .. import __version__

    bert, limits = state.bert, state.limits
    threads = getattr(bert, "threads", None)
    return json_response(
        {
            "model_id": state.names[0],
            "model_names": list(state.names),
            "version": f"bertattn {__version__}",
            "device": str(bert.device),
            "dtype": bert.precision,  # --dtype auto: resolved; int8 as such
            "dtype_reason": getattr(bert, "dtype_reason", None),  # why auto chose it, else None
            "threads": None if threads is None else threads.describe(),
            "dimensions": state.width,
            "pooling": bert.pooling,
            "normalize": bert.normalize,
            "max_input_length": state.max_input_tokens,
            "truncate": limits.truncate,
            "max_batch_tokens": limits.max_batch_tokens,
            "max_queue_tokens": limits.max_queue_tokens,
            "max_queue_time": limits.max_queue_s,
            "min_queue_requests": limits.min_queue_requests,
            "max_client_batch_size": limits.max_request_inputs,
            "max_body_bytes": limits.max_body_bytes,
            "auth": limits.api_key is not None,
            "model_type": state.served.kind,
            "head": state.served.describe(),
            "routes": list(ROUTES[state.served.kind]),
            **_labels(state),
        }
    )


def _labels(state: ServeState) -> dict[str, Any]:
    """A classifier's or reranker's labels, for ``/info``."""
    labels = getattr(state.served.model, "id2label", None)
    return {} if labels is None else {"id2label": {str(k): v for k, v in labels.items()}}


async def _live(state: ServeState, request: Request) -> Response:
    return json_response({"status": "ok"})


async def _ready(state: ServeState, request: Request) -> Response:
    if state.ready:
        return json_response({"status": "ready"})
    why = "draining" if state.draining else "worker failed"
    return json_response({"status": why}, 503)


async def _health(state: ServeState, request: Request) -> Response:
    if state.batcher.failed is not None:
        return json_response({"status": "model worker failed"}, 503)
    return json_response({"status": "ok"})


async def _metrics(state: ServeState, request: Request) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


class _CutShort:
    """ASGI middleware: a request cancelled before its answer started (a second SIGTERM, the
    end of the drain's time) gets 503 in the envelope with ``Connection: close``, not
    uvicorn's plain-text 500."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if not started:
                started = True
                error = unavailable()
                error.message = (
                    "the server stopped before this request was answered; send it again, to "
                    "another replica."
                )
                headers = [
                    (b"content-type", b"application/json"),
                    (b"retry-after", b"1"),
                    (b"connection", b"close"),
                ]
                try:
                    await send({"type": "http.response.start", "status": 503, "headers": headers})
                    await send({"type": "http.response.body", "body": dumps(error.body())})
                except Exception:  # noqa: BLE001  (the connection is gone: nothing to answer)
                    pass
            raise


# ---------------------------------------------------------------------- the app
def create_app(bert: Any, *, one_worker: bool = False, **limits: Any) -> Starlette:
    """The server for ``bert`` as an ASGI app: a loaded :class:`bertattn.Bert` (embeddings),
    :class:`bertattn.CrossEncoder` (a reranker or classifier: ``/rerank``, ``/v1/rerank``,
    ``/predict``) or :class:`bertattn.SparseEncoder` (``/embed_sparse``); see :mod:`.served`.

    ``limits``: the keyword arguments of :class:`bertattn.serve.Limits` (``max_batch_tokens``,
    ``max_queue_tokens``, ``max_queue_s``, ``max_request_inputs``, ``max_input_tokens``,
    ``truncate``, ``max_body_bytes``, ``api_key``, ``max_wait_s``, ``names``). The model worker
    starts with the app's lifespan (or on the first request when mounted without one) and
    finishes the admitted work when the lifespan ends. ``app.state.serve`` is the
    :class:`ServeState`.

    ``bert`` may be a list of models (an embedder and its reranker, say): each request goes to
    the model it names (:class:`ServeGroup`). Each model has a worker of its own, so one
    model's backlog never waits behind another's; ``one_worker=True`` runs their batches one
    at a time, in the order they were formed, as a single worker would (on a machine with few
    cores, two models computing at once share its cores anyway)."""

    state: Any
    if isinstance(bert, (list, tuple)) and len(bert) > 1:
        checked = Limits(**limits)
        if checked.names or checked.served_name is not None:
            raise ValueError(
                "names / served_name name one model; several models are served under their "
                "own names (a folder's name and path, a hub name)."
            )
        holder: dict[str, Any] = {}
        metrics = ServeMetrics(lambda: holder["group"].batcher.depth())
        state = holder["group"] = ServeGroup([ServeState(m, checked, metrics) for m in bert])
        if one_worker:
            state.take_turns()
    else:
        if one_worker:
            raise ValueError("one_worker applies to several models; one model has one worker.")
        state = ServeState(bert[0] if isinstance(bert, (list, tuple)) else bert, Limits(**limits))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the model was loaded on this thread; its OpenMP threads would slow the worker's
        # (bertattn.openmp): given back before the worker starts
        release_openmp_threads()
        state.batcher.start()
        try:
            yield
        finally:
            state.drain()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, state.batcher.stop, state.stop_timeout)
            if isinstance(state, ServeGroup):
                state.shutdown_tokenizers()
            else:
                state.tokenizer_thread.shutdown(wait=False)

    async def not_found(request: Request, exc: Exception) -> Response:
        """404 (no route) and 405 (with ``Allow``: the methods the route takes), counted in
        /metrics under the route ``unmatched``."""
        status = getattr(exc, "status_code", 500)
        path = clip(request.url.path)
        if status == 404:
            msg = f"no route {path}; see GET /info and docs/serving.md."
        elif status == 405:
            msg = f"{clip(request.method, 20)} is not allowed on {path}."
        else:
            msg = getattr(exc, "detail", None) or "error"
        headers = dict(getattr(exc, "headers", None) or {})
        if state.draining:
            headers["connection"] = "close"
        response = json_response(
            envelope(str(msg), "invalid_request_error", None, None), status, headers
        )
        state.metrics.requests.inc("unmatched", str(status))
        return response

    async def server_error(request: Request, exc: Exception) -> Response:
        logger.exception("unexpected error on %s", request.url.path)
        return json_response(envelope("internal server error", "server_error", None, None), 500)

    routes = [
        _route("/v1/embeddings", "embeddings", _openai, data=True, method="POST"),
        _route("/embeddings", "embeddings", _openai, data=True, method="POST"),
        _route("/embed", "embed", _tei, data=True, method="POST"),
        _route("/tokenize", "tokenize", _tokenize, data=True, method="POST"),
        *(
            _route(path, name, fn, data=True, method="POST")
            for path, name, fn in token_routes(HEAD_ROUTES)  # + /embed_all, /decode, ...
        ),
        _route("/v1/models", "models", _models, data=True),
        _route("/info", "info", _info, data=False, key=True),
        _route("/live", "live", _live, data=False),
        _route("/ready", "ready", _ready, data=False),
        _route("/health", "health", _health, data=False),
        _route("/metrics", "metrics", _metrics, data=False),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AccessLog), Middleware(_CutShort)],  # a line per request
        lifespan=lifespan,
        exception_handlers={HTTPException: not_found, Exception: server_error},
    )
    app.state.serve = state
    return app
