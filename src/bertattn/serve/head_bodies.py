"""Request bodies of the head routes, checked field by field (as :mod:`.bodies`):

- ``POST /rerank`` (Text Embeddings Inference): ``query``, ``texts``, ``raw_scores``,
  ``return_text``, ``truncate``, ``truncation_direction``;
- ``POST /v1/rerank`` (Cohere, Jina, infinity, vLLM): ``model``, ``query``, ``documents``
  (strings or ``{"text"}``), ``top_n``, ``return_documents``, ``max_tokens_per_doc``;
- ``POST /predict`` (TEI): ``inputs`` (a text, a pair ``[a, b]``, or a list of them),
  ``raw_scores``, ``truncate``, ``truncation_direction``;
- ``POST /embed_sparse`` (TEI): ``inputs`` (a text or a list), ``truncate``,
  ``truncation_direction``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .bodies import (
    bool_field,
    check_count,
    check_direction,
    check_inputs,
    check_model,
    check_unknown,
    json_kind,
)
from .errors import ApiError, shown

__all__ = [
    "PredictRequest",
    "RerankRequest",
    "check_predict",
    "check_rerank",
    "check_rerank_v1",
    "check_sparse",
]


@dataclass
class RerankRequest:
    """A checked rerank: ``query`` against ``documents``; what to answer."""

    query: str
    documents: list[str]
    raw_scores: bool = False
    return_documents: bool = False
    top_n: int | None = None
    max_tokens_per_doc: int | None = None
    truncate: bool | None = None


def _query(obj: dict[str, Any]) -> str:
    query = obj.get("query")
    if not isinstance(query, str):
        got = "missing" if "query" not in obj else json_kind(query)
        raise ApiError(400, f"'query' must be a string, got {got}.", param="query")
    return query


def _positive(obj: dict[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        got = shown(value, 40) if isinstance(value, (int, float)) else json_kind(value)
        raise ApiError(400, f"'{name}' must be a positive integer, got {got}.", param=name)
    return value


def check_rerank(obj: dict[str, Any], *, limit: int) -> RerankRequest:
    """TEI's ``POST /rerank`` body."""
    check_unknown(
        obj, ("query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction")
    )
    query = _query(obj)
    if "texts" not in obj:
        raise ApiError(400, "'texts' is required: the documents to rank.", param="texts")
    docs = obj["texts"]
    if not isinstance(docs, list):
        raise ApiError(
            400, f"'texts' must be an array of strings, got {json_kind(docs)}.", param="texts"
        )
    texts = check_inputs(docs, "texts", limit, 0, ids=False).texts or []
    check_direction(obj)
    return RerankRequest(
        query,
        texts,
        raw_scores=bool(bool_field(obj, "raw_scores")),
        return_documents=bool(bool_field(obj, "return_text")),
        truncate=bool_field(obj, "truncate"),
    )


def check_rerank_v1(obj: dict[str, Any], *, names: tuple[str, ...], limit: int) -> RerankRequest:
    """The ``POST /v1/rerank`` body of Cohere / Jina / infinity / vLLM."""
    check_unknown(
        obj, ("model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc")
    )
    if obj.get("model") is not None:
        check_model(obj["model"], names)
    query = _query(obj)
    docs = obj.get("documents")
    if not isinstance(docs, list):
        got = "missing" if "documents" not in obj else json_kind(docs)
        raise ApiError(
            400,
            f"'documents' must be an array of strings or of {{\"text\": ...}} objects, got {got}.",
            param="documents",
        )
    check_count(len(docs), limit, "documents")
    texts = []
    for i, d in enumerate(docs):
        if isinstance(d, dict) and set(d) == {"text"}:
            d = d["text"]
        if not isinstance(d, str):
            raise ApiError(
                400,
                f"'documents[{i}]' is {json_kind(d)}; a document is a string or {{\"text\": ...}}.",
                param=f"documents[{i}]",
            )
        texts.append(d)
    return RerankRequest(
        query,
        texts,
        return_documents=bool(bool_field(obj, "return_documents")),
        top_n=_positive(obj, "top_n"),
        max_tokens_per_doc=_positive(obj, "max_tokens_per_doc"),
    )


@dataclass
class PredictRequest:
    """A checked ``POST /predict``: the inputs (texts or pairs), whether one input was given
    bare (answered with one list), ``raw_scores`` and ``truncate`` (None: the server's)."""

    inputs: list[str | tuple[str, str]]
    single: bool
    raw_scores: bool = False
    truncate: bool | None = None


def check_predict(obj: dict[str, Any], *, limit: int) -> PredictRequest:
    """TEI's ``POST /predict`` body; an input is a text or a ``(text, text)`` pair (``[a,
    b]``: one pair, as TEI reads it)."""
    check_unknown(obj, ("inputs", "raw_scores", "truncate", "truncation_direction"))
    if "inputs" not in obj:
        raise ApiError(400, "'inputs' is required: the text(s) or pair(s).", param="inputs")
    value = obj["inputs"]
    check_direction(obj)
    raw = bool(bool_field(obj, "raw_scores"))
    truncate = bool_field(obj, "truncate")
    if isinstance(value, str):
        return PredictRequest([value], True, raw, truncate)
    if _is_pair(value):
        return PredictRequest([(value[0], value[1])], True, raw, truncate)
    if not isinstance(value, list):
        raise ApiError(
            400, f"'inputs' must be a text, a pair [a, b] or an array of those, got "
            f"{json_kind(value)}.", param="inputs"
        )  # fmt: skip
    check_count(len(value), limit, "inputs")
    out: list[str | tuple[str, str]] = []
    for i, v in enumerate(value):
        if isinstance(v, str):
            out.append(v)
        elif _is_pair(v):
            out.append((v[0], v[1]))
        else:
            raise ApiError(
                400, f"'inputs[{i}]' is {json_kind(v)}; an input is a text or a pair [a, b].",
                param=f"inputs[{i}]",
            )  # fmt: skip
    return PredictRequest(out, False, raw, truncate)


def _is_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(t, str) for t in value)


def check_sparse(obj: dict[str, Any], *, limit: int) -> tuple[list[str], bool | None]:
    """TEI's ``POST /embed_sparse`` body -> ``(texts, truncate)``."""
    check_unknown(obj, ("inputs", "truncate", "truncation_direction"))
    if "inputs" not in obj:
        raise ApiError(400, "'inputs' is required: the text(s) to embed.", param="inputs")
    req = check_inputs(obj["inputs"], "inputs", limit, 0, ids=False)
    check_direction(obj)
    return req.texts or [], bool_field(obj, "truncate")
