"""The ASGI application: authentication, admission, drain state, over the routes of the table
in :mod:`.routes` (the handlers live in the ``*_routes`` modules, the state they share in
:mod:`.state`).

:func:`create_app` ``(bert, **limits)`` returns a Starlette app; ``bertattn serve`` runs it in
uvicorn, and it can be mounted in any ASGI server. Data routes (``/v1/embeddings``, ``/embed``,
``/tokenize``, ``/v1/models``) and ``/info`` need the API key when one is set; probes
(``/live``, ``/ready``, ``/health``) and ``/metrics`` stay open.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..runtime.openmp import release_openmp_threads
from . import routes
from .access_log import AccessLog
from .encoding import dumps
from .errors import ApiError, clip, envelope
from .group import ServeGroup
from .handling import json_response, read_body, unavailable
from .limits import Limits
from .routes import ServeRoute
from .state import ServeState
from .telemetry import ServeMetrics

logger = logging.getLogger("bertattn.serve")

__all__ = ["create_app"]


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


# ---------------------------------------------------------------------- routes
def _route(route: ServeRoute) -> Route:
    """The app's route for a row of the table: it counts its answers (the status the client
    gets), turns ApiError into the envelope, checks the key (``data`` or ``key``) and
    (``data``) the drain state, counts itself in flight and, for a POST, refuses (400) a
    model that does not answer it. While the server drains, every answer says
    ``Connection: close``."""
    path, name, data, method = route.path, route.name, route.data, route.method

    async def endpoint(request: Request) -> Response:
        serve = request.app.state.serve  # a ServeState, or a ServeGroup of several models
        state = serve
        status = 500
        counted = False
        try:
            try:
                if data or route.key:
                    _check_key(serve, request)
                if data and isinstance(serve, ServeGroup) and method == "POST":
                    state = await serve.pick(request, route, await read_body(serve, request))
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
                if data and method == "POST" and not route.every:
                    state.served.require(path)
                response = await route.handler_for(state)(state, request)
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
def _serve_state(bert: Any, one_worker: bool, limits: dict[str, Any]) -> Any:
    """The :class:`ServeState` of one model, or the :class:`ServeGroup` of several (each with
    its own worker; ``one_worker``: their batches one at a time)."""
    if isinstance(bert, (list, tuple)) and len(bert) > 1:
        checked = Limits(**limits)
        if checked.names or checked.served_name is not None:
            raise ValueError(
                "names / served_name name one model; several models are served under their "
                "own names (a folder's name and path, a hub name)."
            )
        holder: dict[str, Any] = {}
        metrics = ServeMetrics(lambda: holder["group"].batcher.depth())
        group = holder["group"] = ServeGroup([ServeState(m, checked, metrics) for m in bert])
        if one_worker:
            group.take_turns()
        return group
    if one_worker:
        raise ValueError("one_worker applies to several models; one model has one worker.")
    return ServeState(bert[0] if isinstance(bert, (list, tuple)) else bert, Limits(**limits))


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

    state = _serve_state(bert, one_worker, limits)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the model was loaded on this thread; its OpenMP threads would slow the worker's
        # (bertattn.runtime.openmp): given back before the worker starts
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

    served = [_route(r) for r in routes.ROUTES]  # the table as it is now
    app = Starlette(
        routes=served,
        middleware=[Middleware(AccessLog), Middleware(_CutShort)],  # a line per request
        lifespan=lifespan,
        exception_handlers={HTTPException: not_found, Exception: server_error},
    )
    app.state.serve = state
    return app
