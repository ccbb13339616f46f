"""The token-vector routes, on the model's one batcher (token budget, admission, deadlines,
drain, metrics) as every route:

- ``POST /embed_all`` (TEI): each input's last hidden states, one vector per token (special
  tokens included), as ``Bert.encode(output_value="token_embeddings")``;
- ``POST /decode`` (TEI): token ids back to text (every kind of model);
- ``POST /embed_late_chunks``: one row per span of a text from one forward of the whole text
  (overlapping windows past the model's length), as :meth:`bertattn.Bert.encode_late_chunks`;
- ``POST /embed_multi_vector``: a multi-vector model's token rows, as
  :meth:`bertattn.MultiVectorEncoder.encode_query` / ``encode_document``;
- ``POST /embed_m3``: bge-m3's dense, sparse and ColBERT outputs from one forward, as
  :meth:`bertattn.M3Encoder.encode` (lexical weights in ``/embed_sparse``'s shape);
- ``POST /rerank`` and ``/v1/rerank`` on a multi-vector model: scored by MaxSim (the other
  kinds keep the head routes' handlers; the table of :mod:`.routes` says which).

Token vectors are large: a request whose answer could hold more than ``--max-body-size``
bytes (counted before the model runs, at the most a value takes in the asked format) is
refused with 413 naming that limit and the format that would fit. Bodies: :mod:`.token_bodies`.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .encoding import dumps
from .errors import ApiError
from .handling import checked, json_response, read_body, rerank_answer, rerank_v1_answer, run_model
from .head_bodies import check_rerank, check_rerank_v1
from .token_bodies import (
    Format,
    check_decode,
    check_embed_all,
    check_late_chunks,
    check_m3,
    check_multi_vector,
)
from .token_steps import Job
from .tokens import TokenIds, tokenize

if TYPE_CHECKING:
    from .state import ServeState

__all__ = [
    "check_size",
    "decode",
    "embed_all",
    "embed_late_chunks",
    "embed_m3",
    "embed_multi_vector",
    "rerank_maxsim",
    "rerank_v1_maxsim",
]

#: values in a response above which it is written on a worker thread, not the event loop
_INLINE_VALUES = 16384


# ---------------------------------------------------------------------- helpers
def check_size(state: ServeState, values: int, fmt: Format, what: str) -> None:
    """413 when ``values`` numbers in ``fmt`` could be more than ``max_body_bytes``."""
    limit = state.limits.max_body_bytes
    size = int(values * fmt.bytes_per_value())
    if size > limit:
        smaller = (
            "" if fmt.base64 and fmt.half else
            " or ask for 'encoding_format': 'base64'" + ("" if fmt.base64 else " (3x smaller)")
            + (" with 'dtype': 'float16'" if fmt.base64 else "")
        )  # fmt: skip
        raise ApiError(
            413,
            f"the answer would hold {what}: {values} numbers, up to {size} bytes as "
            f"{'base64' if fmt.base64 else 'JSON numbers'}, more than this server's limit of "
            f"{limit} bytes (--max-body-size); send fewer or shorter inputs{smaller}.",
            code="response_too_large",
        )


def _vectors(rows: np.ndarray, fmt: Format) -> Any:
    """``(n, d)`` float32 rows as the response writes them: the array (JSON numbers), or
    one base64 string of its little-endian bytes, row-major."""
    if not fmt.base64:
        return np.ascontiguousarray(rows, dtype=np.float32)
    data = np.ascontiguousarray(rows, dtype="<f2" if fmt.half else "<f4").tobytes()
    return base64.b64encode(data).decode("ascii")


def _rows_each(rows: np.ndarray, fmt: Format) -> Any:
    """``(S, d)`` rows, one vector each: a list of arrays or of base64 strings."""
    return [_vectors(r, fmt) for r in rows]


async def _answer(state: ServeState, values: int, data: Any) -> Response:
    """``data`` as the 200 answer, written on a worker thread when it holds many values."""
    start = time.perf_counter()
    body = dumps(data) if values <= _INLINE_VALUES else await run_in_threadpool(dumps, data)
    state.metrics.stage.observe(time.perf_counter() - start, "serialization")
    return Response(body, 200, media_type="application/json")


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows, dtype=np.float64))[:, None]
    return (rows / np.maximum(norms, 1e-12)).astype(np.float32)


async def _jobs(
    state: ServeState,
    request: Request,
    texts: list[str],
    what: str,
    *,
    limit: int,
    truncate: bool,
    param: str = "inputs",
    flags: tuple[str, ...] = (),
) -> tuple[list[Job], list[int]]:
    """The texts tokenized (cut at ``limit``, or refused past it without ``truncate``) as
    :class:`Job` items of ``what``, and their token counts."""
    encodings, counts = await state.tokenize(tokenize, texts, limit, truncate, param)
    return [Job(e, what, flags) for e in encodings], counts


# ---------------------------------------------------------------------- /embed_all, /decode
async def embed_all(state: ServeState, request: Request) -> Response:
    """TEI: per input a list of token vectors (``[[[float]]]``; one input given bare: the
    same, a list of one); base64: one string per input, ``(tokens, dim)`` row-major."""
    obj = await read_body(state, request)
    req = await checked(request, check_embed_all, obj, limit=state.limits.max_request_inputs)
    truncate = state.limits.truncate if req.truncate is None else req.truncate
    jobs, counts = await _jobs(
        state, request, req.texts, "hidden", limit=state.max_input_tokens, truncate=truncate
    )
    width = int(state.bert.model.config.hidden_size)
    check_size(state, sum(counts) * width, req.format, f"{sum(counts)} token vectors of {width}")
    rows = await run_model(state, request, jobs, counts, "inputs", stack=False)
    return await _answer(state, sum(counts) * width, [_vectors(r, req.format) for r in rows])


def _decode_all(bert: Any, ids: list[list[int]], skip: bool) -> list[str]:
    return [bert.tokenizer.decode(row, skip_special_tokens=skip) for row in ids]


async def decode(state: ServeState, request: Request) -> Response:
    """TEI: the texts of token ids, one string per id list (``[str]``)."""
    obj = await read_body(state, request)
    req = await checked(
        request, check_decode, obj, limit=state.limits.max_request_inputs, vocab=state.vocab,
        most=state.limits.max_decode_ids,
    )  # fmt: skip
    if sum(map(len, req.ids)) > 4096:  # off the loop: it gets the interpreter between lists
        texts = await run_in_threadpool(_decode_all, state.bert, req.ids, req.skip_special_tokens)
    else:
        texts = _decode_all(state.bert, req.ids, req.skip_special_tokens)
    return json_response(texts)


# ---------------------------------------------------------------------- late chunks
def _plan(bert: Any, texts: list[str], limit: int, overlap: int | None, most: int) -> list[Any]:
    """(tokenizer lock held) The text's windows (:func:`bertattn.encoder.late_chunks.plan_text`);
    a text of more than ``most`` tokens is refused before it is tokenized whole."""
    from ..encoder.late_chunks import plan_text

    text = texts[0]
    if bert.tokenizer.count_tokens(text, most=most) is None:
        raise ApiError(
            413,
            f"'text' has more than {most} tokens, more than this server's queue can ever hold "
            f"(--max-queue-tokens); split the document.",
            param="text",
            code="request_too_large",
        )
    try:
        return [plan_text(bert, text, max_length=limit, overlap=overlap)]
    except ValueError as exc:
        param = "overlap" if "overlap" in str(exc) else "text"
        raise ApiError(400, str(exc), param=param) from None


async def _late_chunks(state: ServeState, request: Request) -> Response:
    """One row per span: ``[[float]]`` (base64: one string per row), equal to
    ``Bert.encode_late_chunks(text, spans)`` with the windows of ``--max-input-tokens``."""
    from ..encoder.late_chunks import late_options, pool_windows, span_members

    state.served.require("/embed_late_chunks")
    obj = await read_body(state, request)
    req = await checked(request, check_late_chunks, obj, limit=state.limits.max_request_inputs)
    try:
        pooling, normalize, _ = late_options(state.bert, req.pooling, req.normalize, None)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="pooling") from None
    (plan,) = await state.tokenize(
        _plan, [req.text], state.max_input_tokens, req.overlap, state.batcher.max_queue_tokens
    )
    try:
        span_members(req.text, plan.offsets, req.spans)  # a span without tokens: before the model
    except ValueError as exc:
        raise ApiError(400, str(exc), param=str(exc).split(" ", 1)[0]) from None
    width = int(state.bert.get_embedding_dimension())
    check_size(state, len(req.spans) * width, req.format, f"{len(req.spans)} rows of {width}")
    jobs = [
        Job(TokenIds(row.tolist(), kind.tolist()), "hidden")
        for row, kind in zip(plan.rows, plan.kinds, strict=True)
    ]
    counts = [len(j.encoding.ids) for j in jobs]
    windows = await run_model(state, request, jobs, counts, "text", stack=False)
    emb = await run_in_threadpool(  # off the event loop: (S, E)
        pool_windows, plan, windows, req.text, req.spans, pooling=pooling, normalize=normalize,
        truncate_dim=state.bert.truncate_dim,
    )  # fmt: skip
    return await _answer(state, emb.size, _rows_each(emb, req.format))


# ---------------------------------------------------------------------- multi-vector
def _task_texts(model: Any, texts: list[str], task: str, name: str | None, prompt: str | None):
    """The texts with the prompt ``encode_query`` / ``encode_document`` would prepend."""
    if name is None and prompt is None and task in model.prompts:
        name = task
    chosen = model._prompt(prompt, name)
    return [chosen + t for t in texts] if chosen else list(texts)


def _task_limit(state: ServeState, task: str) -> tuple[int, bool | None]:
    """``(tokens kept, forced truncate)``: the folder's length for the task when it is below
    the server's limit (the model is made to cut there: always cut), else the server's."""
    length = state.served.model.task_length(task)  # an expanded query's: the expansion's
    if length is not None and length < state.max_input_tokens:
        return length, True
    return state.max_input_tokens, None


async def _multi_vector_rows(
    state: ServeState,
    request: Request,
    texts: list[str],
    task: str,
    truncate: bool | None,
    param: str,
    fmt: Format | None = None,
) -> tuple[list[np.ndarray], int]:
    """The token rows of texts for ``task`` (prompted, cut) and the tokens they held;
    ``fmt``: the response format whose size is checked first."""
    limit, forced = _task_limit(state, task)
    cut = forced or (state.limits.truncate if truncate is None else truncate)
    jobs, counts = await _jobs(state, request, texts, task, limit=limit, truncate=cut, param=param)
    if fmt is not None:
        width = int(state.served.model.get_embedding_dimension())
        check_size(state, sum(counts) * width, fmt, f"up to {sum(counts)} token vectors")
    rows = await run_model(state, request, jobs, counts, param, stack=False)
    return rows, int(sum(counts))


async def embed_multi_vector(state: ServeState, request: Request) -> Response:
    """Per input its token rows, ``[[[float]]]`` (base64: one string per input)."""
    model = state.served.model
    obj = await read_body(state, request)
    req = await checked(
        request, check_multi_vector, obj, limit=state.limits.max_request_inputs,
        width=model.get_embedding_dimension(), prompts=model.prompts,
    )  # fmt: skip
    texts = _task_texts(model, req.texts, req.task, req.prompt_name, req.prompt)
    rows, _ = await _multi_vector_rows(
        state, request, texts, req.task, req.truncate, "inputs", req.format
    )
    if req.dimensions is not None:
        rows = [_unit(r[:, : req.dimensions]) for r in rows]
    return await _answer(state, sum(r.size for r in rows), [_vectors(r, req.format) for r in rows])


async def _maxsim(
    state: ServeState, request: Request, query: str, docs: list[str], param: str
) -> tuple[np.ndarray, int]:
    """``(D,)`` MaxSim scores of the query against each document (the folder's prompts,
    lengths and skip-list; mean-MaxSim where it says so) and the tokens they held."""
    from ..heads.multi_vector import maxsim

    model = state.served.model
    q_text = _task_texts(model, [query], "query", None, None)
    d_texts = _task_texts(model, docs, "document", None, None)
    (q,), q_tokens = await _multi_vector_rows(state, request, q_text, "query", None, "query")
    d, d_tokens = await _multi_vector_rows(state, request, d_texts, "document", None, param)
    mean = model.similarity_fn_name == "meanmaxsim"
    qs, ds = [torch.from_numpy(q)], [torch.from_numpy(x) for x in d]
    if sum(len(x) for x in d) * len(q) > 1 << 20:
        scores = await run_in_threadpool(maxsim, qs, ds, length_normalize=mean)
    else:
        scores = maxsim(qs, ds, length_normalize=mean)
    return scores[0].numpy(), q_tokens + d_tokens


async def rerank_maxsim(state: ServeState, request: Request) -> Response:
    """TEI's ``/rerank`` on a multi-vector model: ``[{"index", "score", "text"?}]`` best
    first, the score MaxSim (no activation: ``raw_scores`` changes nothing)."""
    obj = await read_body(state, request)
    req = await checked(request, check_rerank, obj, limit=state.limits.max_request_inputs)
    scores, _ = await _maxsim(state, request, req.query, req.documents, "texts")
    return rerank_answer(req, scores)


async def rerank_v1_maxsim(state: ServeState, request: Request) -> Response:
    """Cohere / Jina's ``/v1/rerank`` on a multi-vector model, scored by MaxSim."""
    obj = await read_body(state, request)
    req = await checked(
        request, check_rerank_v1, obj, names=state.names, limit=state.limits.max_request_inputs
    )
    if req.max_tokens_per_doc is not None:
        raise ApiError(
            400,
            "'max_tokens_per_doc' scores a cross-encoder's windows; a multi-vector model cuts "
            "documents at its document length and scores every token kept: drop it.",
            param="max_tokens_per_doc",
        )
    scores, tokens = await _maxsim(state, request, req.query, req.documents, "documents")
    return rerank_v1_answer(state, req, scores, tokens)


# ---------------------------------------------------------------------- bge-m3
async def embed_m3(state: ServeState, request: Request) -> Response:
    """``{"dense_vecs", "lexical_weights", "colbert_vecs"}`` (FlagEmbedding's keys; null for
    an output not asked): dense ``[[float]]``, lexical weights per input
    ``[{"index": token_id, "value": weight}]`` by id (``/embed_sparse``'s shape), ColBERT
    vectors per input ``[[float]]`` (base64: one string per vector / matrix). One input
    given bare: one row / list / matrix per key."""
    model = state.served.model
    obj = await read_body(state, request)
    req = await checked(request, check_m3, obj, limit=state.limits.max_request_inputs)
    limit = min(req.max_length or model.passage_max_length, state.max_input_tokens)
    truncate = state.limits.truncate if req.truncate is None else req.truncate
    if req.max_length is not None and req.max_length < state.max_input_tokens:
        truncate = True  # the body asked for the cut
    jobs, counts = await _jobs(
        state, request, req.texts, "m3", limit=limit, truncate=truncate, flags=req.flags
    )
    n, hidden = len(counts), int(state.bert.model.config.hidden_size)
    values = (n * hidden if "dense" in req.flags else 0) + (
        (sum(counts) - n) * model.colbert_dim if "colbert" in req.flags else 0
    )
    values += 2 * sum(counts) if "lexical" in req.flags else 0  # an id and a weight a token
    check_size(state, values, req.format, f"{n} inputs' outputs")
    rows = await run_model(state, request, jobs, counts, "inputs", stack=False)
    out: dict[str, Any] = {"dense_vecs": None, "lexical_weights": None, "colbert_vecs": None}
    if "dense" in req.flags:
        out["dense_vecs"] = [_vectors(r["dense"], req.format) for r in rows]
    if "lexical" in req.flags:
        out["lexical_weights"] = [
            [{"index": int(k), "value": v} for k, v in sorted(r["lexical"].items(), key=_by_id)]
            for r in rows
        ]
    if "colbert" in req.flags:
        out["colbert_vecs"] = [_vectors(r["colbert"], req.format) for r in rows]
    if req.single:
        out = {k: None if v is None else v[0] for k, v in out.items()}
    return await _answer(state, values, out)


def _by_id(item: tuple[str, float]) -> int:
    return int(item[0])


#: the late-chunking handler under the name the route table imports
embed_late_chunks = _late_chunks
