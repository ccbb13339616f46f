"""The head routes' handlers: ``POST /rerank`` and ``/v1/rerank`` (a reranker), ``/predict``
(a reranker or classifier), ``/embed_sparse`` (SPLADE), on the same batcher as the embeddings
(token budget, admission, deadlines, drain, metrics); the table of :mod:`.routes` maps the
paths to them. Bodies: :mod:`.head_bodies`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .handling import checked, json_response, read_body, rerank_answer, rerank_v1_answer, run_model
from .head_bodies import check_predict, check_rerank, check_rerank_v1, check_sparse
from .tokens import TRUNCATE_FIX, WindowTally, tokenize_inputs, window_plans, windows_of

if TYPE_CHECKING:
    from .state import ServeState

__all__ = ["embed_sparse", "predict", "rerank", "rerank_v1"]

#: how ``/v1/rerank`` (whose body has no ``truncate``) lets an over-long document through on a
#: ``--no-truncate`` server
_V1_FIX = (
    "send 'max_tokens_per_doc' to score the whole document in windows, or start the server "
    "with --truncate"
)
#: windows of at most this many tokens in all are built on the event loop
_INLINE_WINDOW_TOKENS = 16384


async def _scores(
    state: ServeState,
    request: Request,
    inputs: list[Any],
    truncate: bool | None,
    param: str,
    fix: str = TRUNCATE_FIX,
) -> tuple[np.ndarray, int]:
    """``(N, num_labels)`` logits of texts or pairs, and the real tokens they held;
    ``truncate`` None: the server's setting (``--truncate`` / ``--no-truncate``); ``fix``: how
    the route lets an over-long input through, named in its 400."""
    cut = state.limits.truncate if truncate is None else truncate
    encodings, counts = await state.tokenize(
        tokenize_inputs, inputs, state.max_input_tokens, cut, param, fix
    )
    return await run_model(state, request, encodings, counts, param), int(sum(counts))


def _activate(state: ServeState, logits: np.ndarray) -> np.ndarray:
    """The reranker's scores: its activation (the folder's, else sigmoid for one label)."""
    fn = state.served.model.activation_fn
    return fn(torch.from_numpy(logits)).float().numpy()


async def rerank(state: ServeState, request: Request) -> Response:
    """TEI: ``[{"index", "score", "text"?}]`` best first."""
    obj = await read_body(state, request)
    req = await checked(request, check_rerank, obj, limit=state.limits.max_request_inputs)
    pairs = [(req.query, d) for d in req.documents]
    logits, _ = await _scores(state, request, pairs, req.truncate, "texts")
    scores = logits[:, 0] if req.raw_scores else _activate(state, logits)[:, 0]
    return rerank_answer(req, scores)


async def rerank_v1(state: ServeState, request: Request) -> Response:
    """Cohere / Jina: ``{"model", "results": [{"index", "relevance_score", "document"?}],
    "usage": {"total_tokens"}}``; ``max_tokens_per_doc``: a long document scored by its best
    window of that many tokens (:meth:`bertattn.CrossEncoder.rank`)."""
    obj = await read_body(state, request)
    req = await checked(
        request, check_rerank_v1, obj, names=state.names, limit=state.limits.max_request_inputs
    )
    pairs = [(req.query, d) for d in req.documents]
    if req.max_tokens_per_doc is None:  # its body has no 'truncate': the server's setting
        logits, tokens = await _scores(state, request, pairs, None, "documents", _V1_FIX)
        scores = _activate(state, logits)[:, 0]
    else:
        tally = WindowTally(state.batcher.max_queue_tokens)  # counted before any is built
        plans = await state.tokenize(
            window_plans, pairs, state.max_input_tokens, req.max_tokens_per_doc, "documents",
            tally, state.limits.truncate,
        )  # fmt: skip
        if tally.tokens > _INLINE_WINDOW_TOKENS:
            groups = await run_in_threadpool(windows_of, state.bert, plans)
        else:
            groups = windows_of(state.bert, plans)
        encodings = [e for g in groups for e in g]
        counts = [len(e.ids) for e in encodings]
        logits = await run_model(state, request, encodings, counts, "documents")
        flat = _activate(state, logits)[:, 0]
        scores, at = np.empty(len(groups), np.float32), 0
        for i, g in enumerate(groups):  # each document: its best window
            scores[i], at = flat[at : at + len(g)].max(), at + len(g)
        tokens = int(sum(counts))
    return rerank_v1_answer(state, req, scores, tokens)


async def predict(state: ServeState, request: Request) -> Response:
    """TEI: per input ``[{"label", "score"}]`` over every label, best first (one list for a
    single input); scores through the pipeline's function (none for regression, sigmoid for
    one label or multi-label, else softmax), or the logits with ``raw_scores``."""
    obj = await read_body(state, request)
    req = await checked(request, check_predict, obj, limit=state.limits.max_request_inputs)
    logits, _ = await _scores(state, request, req.inputs, req.truncate, "inputs")
    head = state.served.model.head
    t = torch.from_numpy(logits)
    if req.raw_scores or head.problem_type == "regression":
        scores = t
    elif head.problem_type == "multi_label_classification" or head.num_labels == 1:
        scores = torch.sigmoid(t)
    else:
        scores = torch.softmax(t, dim=-1)
    labels = state.served.model.id2label
    out = [
        sorted(
            ({"score": float(s), "label": labels[j]} for j, s in enumerate(row)),
            key=lambda d: -d["score"],
        )
        for row in scores.float().numpy()
    ]
    return json_response(out[0] if req.single else out)


async def embed_sparse(state: ServeState, request: Request) -> Response:
    """TEI: per input ``[{"index", "value"}]`` of its non-zero weights, by index."""
    obj = await read_body(state, request)
    texts, truncate = await checked(
        request, check_sparse, obj, limit=state.limits.max_request_inputs
    )
    rows, _ = await _scores(state, request, list(texts), truncate, "inputs")  # (N, V)
    keep = state.served.model.max_active_dims
    out = []
    for row in rows:
        nz = np.flatnonzero(row)
        if keep is not None and len(nz) > keep:
            nz = np.sort(nz[np.argsort(-np.abs(row[nz]), kind="stable")[:keep]])
        out.append([{"index": int(i), "value": float(row[i])} for i in nz])
    return json_response(out)
