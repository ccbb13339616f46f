"""What every data route does with a request, shared by the embedding routes (:mod:`.app`) and
the head routes (:mod:`.head_routes`), which import it from here, not from each other: read
the body (:func:`read_body`: 413, 408, 415, 499), check it (:func:`checked`: off the event loop
for a large body), run its inputs through the model's queue (:func:`run_model`: 429, 413, 504,
499, 503), answer JSON (:func:`json_response`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .batcher import Overloaded, RequestDropped
from .bodies import parse_json, request_timeout
from .encoding import dumps
from .errors import ApiError, clip

if TYPE_CHECKING:
    from .head_bodies import RerankRequest
    from .state import ServeState

__all__ = [
    "BIG_BODY",
    "checked",
    "disconnected",
    "json_response",
    "read_body",
    "ranked",
    "rerank_answer",
    "rerank_v1_answer",
    "run_model",
    "unavailable",
]

#: bodies larger than this are parsed (and checked) off the event loop
BIG_BODY = 256 << 10


def ranked(scores: np.ndarray) -> list[int]:
    """Indices of ``(N,)`` scores best first (a stable order for ties): how every rerank
    route orders its answer."""
    return sorted(range(len(scores)), key=lambda i: -float(scores[i]))


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON response (orjson: :func:`.encoding.dumps`)."""
    return Response(dumps(data), status, headers=headers, media_type="application/json")


def rerank_answer(req: RerankRequest, scores: np.ndarray) -> Response:
    """TEI's ``/rerank`` answer for ``(N,)`` scores of ``req``'s documents:
    ``[{"index", "score", "text"?}]`` best first."""
    out = []
    for i in ranked(scores):
        row: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if req.return_documents:
            row["text"] = req.documents[i]
        out.append(row)
    return json_response(out)


def rerank_v1_answer(
    state: ServeState, req: RerankRequest, scores: np.ndarray, tokens: int
) -> Response:
    """Cohere / Jina's ``/v1/rerank`` answer for ``(N,)`` scores of ``req``'s documents:
    ``{"model", "results": [{"index", "relevance_score", "document"?}], "usage"}``, the best
    ``top_n`` first; ``tokens``: the request's tokens, for ``usage``."""
    results = []
    for i in ranked(scores)[: req.top_n]:
        row: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            row["document"] = {"text": req.documents[i]}
        results.append(row)
    usage = {"total_tokens": tokens}
    return json_response({"model": state.names[0], "results": results, "usage": usage})


async def read_body(state: ServeState, request: Request) -> dict[str, Any]:
    """The JSON object of the body, read within ``max_body_bytes`` (413) and ``body_timeout_s``
    (408: a client that stops sending does not hold a request open). Read once per request:
    a second call returns the same object."""
    cached = getattr(request.state, "body", None)
    if cached is not None:
        return cached
    limit = state.limits.max_body_bytes
    too_big = ApiError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes "
        f"(--max-body-size); split the request.",
        code="body_too_large",
    )
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("", "identity"):
        raise ApiError(
            415,
            f"Content-Encoding {clip(coding, 40)} is not supported; send the body uncompressed "
            f"(no Content-Encoding, or identity).",
            code="unsupported_content_encoding",
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_big

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    seconds = state.limits.body_timeout_s
    try:
        body = await asyncio.wait_for(read(), seconds)
    except asyncio.TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {seconds:g} s; send it whole.",
            code="request_timeout",
        ) from None
    except ClientDisconnect:  # before its request reached the queue: not "gone" (left queued)
        raise ApiError(
            499, "the client went away.", code="client_closed", reason="gone_before_queue"
        ) from None
    content_type = request.headers.get("content-type")
    request.state.big = len(body) > BIG_BODY
    if request.state.big:
        obj = await run_in_threadpool(parse_json, body, content_type)
    else:
        obj = parse_json(body, content_type)
    request.state.body = obj
    return obj


async def checked(request: Request, check: Callable[..., Any], obj: Any, **kw: Any) -> Any:
    """``check(obj, **kw)``: off the event loop for a large body (checking a 16 MB body of
    token ids is ~0.1 s of work: /live and the other requests are answered meanwhile)."""
    if getattr(request.state, "big", False):
        return await run_in_threadpool(lambda: check(obj, **kw))
    return check(obj, **kw)


async def disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next message is the
    disconnect, or the end of our response)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_model(
    state: ServeState,
    request: Request,
    encodings: list[Any],
    counts: list[int],
    param: str,
    *,
    stack: bool = True,
) -> Any:
    """The model step's ``(N, ...)`` float32 rows of tokenized inputs, in input order: admitted
    to the queue (429 / 413), waited for within ``X-Request-Timeout`` (504), dropped when the
    client goes away (499). ``stack=False``: the list of each input's row as the step gave it
    (token vectors: one ``(n_i, d)`` array per input)."""
    timeout = request_timeout(request.headers.get("x-request-timeout"))
    deadline = None if timeout is None else time.monotonic() + timeout
    batcher = state.batcher
    try:
        ticket = batcher.submit(encodings, counts, deadline=deadline)
    except Overloaded as exc:
        if exc.never:
            raise ApiError(
                413,
                f"the request holds {exc.tokens} tokens, more than this server's queue can ever "
                f"hold ({exc.limit}, --max-queue-tokens); split the request.",
                param=param,
                code="request_too_large",
            ) from None
        cap = (
            f"{exc.limit}: --max-queue-time {batcher.max_queue_s:g} s of work at the measured speed"
            if exc.by_time
            else f"{exc.limit}, --max-queue-tokens"
        )
        raise ApiError(
            429,
            f"the server is busy: {exc.queued} tokens are waiting and this request adds "
            f"{exc.tokens} (limit {cap}); retry after {exc.retry_after} s.",
            code="queue_full",
            headers={"Retry-After": str(exc.retry_after)},
        ) from None
    except RequestDropped:
        raise unavailable() from None
    gone = asyncio.ensure_future(disconnected(request))
    try:
        waiting = {ticket.future, gone}
        done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not done:  # the deadline: dropped (504 below) unless its work started, which is
            batcher.expire(ticket)  # then finished and answered, never computed for nobody
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if ticket.future not in done:
            batcher.cancel(ticket, "disconnected")
            raise ApiError(499, "the client went away.", code="client_closed", reason="gone")
        rows = ticket.future.result()
    except RequestDropped as exc:
        if exc.reason == "timeout":
            raise ApiError(
                504,
                f"the request waited past its X-Request-Timeout of {timeout:g} s before the "
                f"model could start it; its work was dropped: retry, or allow more time.",
                code="timeout",
                reason="timeout",
            ) from None
        raise unavailable() from None
    finally:
        gone.cancel()
    return np.stack(rows) if stack else list(rows)  # (N, ...)


def unavailable() -> ApiError:
    """The 503 of a draining server (``Retry-After: 1``)."""
    return ApiError(
        503,
        "the server is shutting down; send the request to another replica.",
        code="shutting_down",
        headers={"Retry-After": "1"},
        reason="draining",
    )
