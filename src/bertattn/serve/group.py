"""Several models in one server (``--model`` given more than once): an embedder beside its
reranker, say. Each model keeps its own :class:`~.state.ServeState` — its own queue, model worker
and tokenizer thread, so one model's backlog never waits behind another's — and they share the
limits, the API key, the drain and one ``/metrics``.

A data request goes to the model its body names (``"model"``, on every route; on the routes
whose body has no such field — ``/embed``, ``/rerank``, ``/predict``, ``/embed_sparse``,
``/tokenize`` — it is taken out before the body is checked), else to the one model that answers
the route; when several do, the request must name one (400 listing them).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from .errors import ApiError, shown

if TYPE_CHECKING:
    from .routes import ServeRoute

__all__ = ["ServeGroup"]


class _Batchers:
    """The group's workers, as the drain and the lifespan see one."""

    def __init__(self, states: list[Any]) -> None:
        self._states = states

    @property
    def failed(self) -> BaseException | None:
        return next((s.batcher.failed for s in self._states if s.batcher.failed), None)

    def start(self) -> None:
        for s in self._states:
            s.batcher.start()

    def idle(self) -> bool:
        return all(s.batcher.idle() for s in self._states)

    def depth(self) -> tuple[int, int]:
        depths = [s.batcher.depth() for s in self._states]
        return sum(d[0] for d in depths), sum(d[1] for d in depths)

    def stop(self, timeout: float | None = None) -> bool:
        """Every worker stopped within ``timeout`` seconds in all."""
        end = None if timeout is None else time.monotonic() + timeout
        ok = True
        for s in self._states:
            left = None if end is None else max(0.0, end - time.monotonic())
            ok = s.batcher.stop(left) and ok
        return ok


class ServeGroup:
    """The models of one server (see the module docstring); ``states[0]`` is the first
    ``--model``."""

    def __init__(self, states: list[Any]) -> None:
        if len(states) < 2:
            raise ValueError("a group serves two models or more; serve one model directly.")
        seen: dict[str, int] = {}
        for i, state in enumerate(states):
            for name in state.names:
                if name in seen and seen[name] != i:
                    raise ValueError(
                        f"two models answer to the name {name!r}; give each its own folder."
                    )
                seen[name] = i
        self.states = states
        first = states[0]
        self.limits = first.limits
        self.metrics = first.metrics  # shared: the states were built with one
        self.batcher = _Batchers(states)
        self.names = tuple(n for s in states for n in s.names)
        self.stop_timeout: float | None = None

    def take_turns(self) -> None:
        """The models' batches run one at a time, first formed first run, as one worker for
        all would run them (before the workers start)."""
        from ..engine import TurnTaking

        turns = TurnTaking()
        for state in self.states:
            state.batcher.step = turns.share(state.batcher.step)

    # ------------------------------------------------------------------ the drain
    @property
    def draining(self) -> bool:
        return self.states[0].draining

    @property
    def ready(self) -> bool:
        return all(s.ready for s in self.states)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.states)

    def drain(self) -> None:
        for s in self.states:
            s.drain()

    def shutdown_tokenizers(self) -> None:
        for s in self.states:
            s.tokenizer_thread.shutdown(wait=False)

    @property
    def started(self) -> float:
        return self.states[0].started

    # ------------------------------------------------------------------ routing
    def by_name(self, name: str) -> Any:
        """The model answering to ``name`` (404 naming the models served)."""
        for state in self.states:
            if name in state.names:
                return state
        raise ApiError(
            404,
            f"The model {shown(name)} does not exist here; this server serves "
            f"{', '.join(repr(s.names[0]) for s in self.states)}.",
            param="model",
            code="model_not_found",
        )

    async def pick(self, request: Request, route: ServeRoute, body: Any) -> Any:
        """The model for a data request on ``route`` whose parsed body is ``body``."""
        path = route.path
        name = body.get("model") if isinstance(body, dict) else None
        if name is not None:
            if not isinstance(name, str):
                raise ApiError(400, "'model' must be a string naming a model.", param="model")
            if not route.model_field:
                del body["model"]  # it chose the model; the route's own body has no such field
            return self.by_name(name)
        answering = [s for s in self.states if route.answers(s)]
        if len(answering) == 1:
            return answering[0]
        models = ", ".join(f"{s.names[0]!r} ({s.served.describe()})" for s in self.states)
        if not answering:
            raise ApiError(
                400,
                f"no model of this server answers POST {path}; it serves {models}.",
                code="wrong_route_for_model",
            )
        raise ApiError(
            400,
            f'several models of this server answer POST {path}: name one with "model" in the '
            f"body ({', '.join(repr(s.names[0]) for s in answering)}).",
            param="model",
        )
