"""The server's routes, in one table (:data:`ROUTES`): each row a path, its method, its
handler, whether it is a data route, and which kinds of model answer it.

A data route answers the models whose head kind's record names it
(:attr:`bertattn.heads.registry.HeadKind.routes`), or every model (``every``: ``/tokenize``,
``/decode``, ``/v1/models``); ``by_kind`` gives another handler for the models of one kind
(``/rerank`` by MaxSim for a multi-vector model). :func:`register_route` adds a row; the app
(:func:`bertattn.serve.create_app`) builds its routes from the table when it is created.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from ..heads import registry
from . import embed_routes, head_routes, info_routes, token_routes

if TYPE_CHECKING:
    from .state import ServeState

__all__ = ["ROUTES", "ServeRoute", "register_route", "unregister_route"]

#: a route's handler: ``(state, request) -> response`` (``state``: the model's
#: :class:`~.state.ServeState`, or for a route that is not a data POST a ServeGroup)
Handler = Callable[[Any, Request], Awaitable[Response]]


@dataclass(frozen=True)
class ServeRoute:
    """One row of the table.

    Attributes:
        path: the URL path (``"/v1/rerank"``).
        name: its label in ``/metrics`` (two paths of one API share one).
        handler: what answers it.
        method: ``"POST"`` or ``"GET"``.
        data: a data route: the API key checked, refused while the server drains or when its
            worker has stopped, counted in flight; a POST picks its model among several.
        key: the API key checked though not a data route (``/info``).
        every: answered for every kind of model; else for the kinds whose record names it.
        by_kind: another handler for the models of a kind (by the record's name).
        model_field: its body has a ``"model"`` field of its own (else, with several models,
            a ``"model"`` that picked one is taken out before the body is checked).
    """

    path: str
    name: str
    handler: Handler
    method: str = "POST"
    data: bool = True
    key: bool = False
    every: bool = False
    by_kind: Mapping[str, Handler] = field(default_factory=dict)
    model_field: bool = False

    def kinds(self) -> tuple[str, ...]:
        """The head kinds (records' names) that answer this route."""
        return tuple(k.name for k in registry.kinds() if self.every or self.path in k.routes)

    def answers(self, state: ServeState) -> bool:
        """Whether the model of ``state`` answers this route."""
        return self.every or self.path in state.served.routes

    def handler_for(self, state: ServeState) -> Handler:
        """The handler for the model of ``state`` (its kind's own, else the route's)."""
        if not self.by_kind:
            return self.handler
        return self.by_kind.get(state.served.record.name, self.handler)


def _get(path: str, name: str, handler: Handler, **how: Any) -> ServeRoute:
    return ServeRoute(path, name, handler, method="GET", every=True, **how)


#: every route of the server
ROUTES: list[ServeRoute] = [
    ServeRoute("/v1/embeddings", "embeddings", embed_routes.embeddings, model_field=True),
    ServeRoute("/embeddings", "embeddings", embed_routes.embeddings, model_field=True),
    ServeRoute("/embed", "embed", embed_routes.embed_tei),
    ServeRoute("/tokenize", "tokenize", embed_routes.tokenize_texts, every=True),
    ServeRoute(
        "/rerank",
        "rerank",
        head_routes.rerank,
        by_kind={"multi-vector": token_routes.rerank_maxsim},
    ),
    ServeRoute(
        "/v1/rerank",
        "rerank",
        head_routes.rerank_v1,
        by_kind={"multi-vector": token_routes.rerank_v1_maxsim},
        model_field=True,
    ),
    ServeRoute("/predict", "predict", head_routes.predict),
    ServeRoute("/embed_sparse", "embed_sparse", head_routes.embed_sparse),
    ServeRoute("/embed_all", "embed_all", token_routes.embed_all),
    ServeRoute("/decode", "decode", token_routes.decode, every=True),
    ServeRoute("/embed_late_chunks", "embed_late_chunks", token_routes.embed_late_chunks),
    ServeRoute("/embed_multi_vector", "embed_multi_vector", token_routes.embed_multi_vector),
    ServeRoute("/embed_m3", "embed_m3", token_routes.embed_m3),
    _get("/v1/models", "models", info_routes.models),
    _get("/info", "info", info_routes.info, data=False, key=True),
    _get("/live", "live", info_routes.live, data=False),
    _get("/ready", "ready", info_routes.ready, data=False),
    _get("/health", "health", info_routes.health, data=False),
    _get("/metrics", "metrics", info_routes.metrics, data=False),
]


def register_route(route: ServeRoute) -> ServeRoute:
    """Add ``route`` to the table (apps created from now on answer it); ``ValueError`` for a
    path and method the table has already."""
    taken = next((r for r in ROUTES if (r.path, r.method) == (route.path, route.method)), None)
    if taken is not None:
        raise ValueError(
            f"{route.method} {route.path} is in the route table already (as {taken.name!r}); "
            f"give the new route a path of its own."
        )
    ROUTES.append(route)
    return route


def unregister_route(path: str, method: str = "POST") -> None:
    """Remove the row of ``path`` and ``method`` (a test's toy route, when it is done)."""
    ROUTES[:] = [r for r in ROUTES if (r.path, r.method) != (path, method)]
