"""The routes about the server: ``GET /v1/models``, ``/info`` (the model, its kind, its
routes and the limits), and the probes ``/live``, ``/ready``, ``/health`` and ``/metrics``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from .group import ServeGroup
from .handling import json_response

if TYPE_CHECKING:
    from .state import ServeState

__all__ = ["health", "info", "live", "metrics", "models", "ready"]


async def models(state: Any, request: Request) -> Response:
    created = int(state.started)
    served = state.states if isinstance(state, ServeGroup) else [state]
    data = [
        {"id": s.names[0], "object": "model", "created": created, "owned_by": "bertattn"}
        for s in served
    ]
    return json_response({"object": "list", "data": data})


async def info(state: Any, request: Request) -> Response:
    if isinstance(state, ServeGroup):  # several models: each one's, in --model order
        infos = [json.loads((await info(s, request)).body) for s in state.states]
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
            "routes": list(state.served.routes),
            **_labels(state),
        }
    )


def _labels(state: ServeState) -> dict[str, Any]:
    """A classifier's or reranker's labels, for ``/info``."""
    labels = getattr(state.served.model, "id2label", None)
    return {} if labels is None else {"id2label": {str(k): v for k, v in labels.items()}}


async def live(state: ServeState, request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(state: ServeState, request: Request) -> Response:
    if state.ready:
        return json_response({"status": "ready"})
    why = "draining" if state.draining else "worker failed"
    return json_response({"status": why}, 503)


async def health(state: ServeState, request: Request) -> Response:
    if state.batcher.failed is not None:
        return json_response({"status": "model worker failed"}, 503)
    return json_response({"status": "ok"})


async def metrics(state: ServeState, request: Request) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")
