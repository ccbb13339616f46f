"""Request bodies of the token-vector routes, checked field by field (as :mod:`.bodies`):

- ``POST /embed_all`` (Text Embeddings Inference): ``inputs``, ``truncate``,
  ``truncation_direction``; and ``encoding_format`` / ``dtype`` (below);
- ``POST /decode`` (TEI): ``ids`` (an array of token ids, or an array of such arrays),
  ``skip_special_tokens`` (default true);
- ``POST /embed_late_chunks``: ``text``, ``spans`` (``[[start, end], ...]`` character offsets),
  ``pooling`` (``"mean"`` / ``"max"``), ``normalize``, ``overlap``;
- ``POST /embed_multi_vector``: ``inputs``, ``task`` (``"query"`` / ``"document"``, default
  ``"document"``), ``prompt_name``, ``prompt``, ``truncate``, ``dimensions``;
- ``POST /embed_m3``: ``inputs``, ``return_dense`` (default true), ``return_sparse``,
  ``return_colbert_vecs`` (default false: FlagEmbedding's), ``max_length``, ``truncate``.

The vector routes take ``encoding_format``: ``"float"`` (JSON numbers, the default) or
``"base64"`` (each vector, or each input's ``(tokens, dim)`` matrix row-major, as little-endian
bytes: OpenAI's format), and ``dtype``: ``"float32"`` (default) or ``"float16"`` (with
``"base64"`` only: half the bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .bodies import bool_field, check_direction, check_inputs, check_unknown, json_kind
from .errors import ApiError, shown

__all__ = [
    "Decode",
    "Format",
    "LateChunks",
    "M3Request",
    "TokenRequest",
    "check_decode",
    "check_embed_all",
    "check_late_chunks",
    "check_m3",
    "check_multi_vector",
]

_FORMAT = ("encoding_format", "dtype")


@dataclass(frozen=True)
class Format:
    """How vectors are written: ``base64`` (else JSON numbers) and ``half`` (float16)."""

    base64: bool = False
    half: bool = False

    def bytes_per_value(self) -> float:
        """The most bytes a value takes in the response: a float32 JSON number is at most 16
        characters with its comma (``-1.17549435e-38,``); base64 is 4/3 of the raw bytes."""
        if not self.base64:
            return 16.0
        return (2 if self.half else 4) * 4 / 3


def check_format(obj: dict[str, Any]) -> Format:
    """``encoding_format`` and ``dtype`` -> :class:`Format`."""
    fmt = obj.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ("float", "base64"):
        got = shown(fmt, 60) if isinstance(fmt, str) else json_kind(fmt)
        raise ApiError(
            400, f"'encoding_format' is {got}; use 'float' or 'base64'.", param="encoding_format"
        )
    dtype = obj.get("dtype")
    dtype = "float32" if dtype is None else dtype
    if dtype not in ("float32", "float16"):
        got = shown(dtype, 60) if isinstance(dtype, str) else json_kind(dtype)
        raise ApiError(400, f"'dtype' is {got}; use 'float32' or 'float16'.", param="dtype")
    if dtype == "float16" and fmt != "base64":
        raise ApiError(
            400,
            "'dtype' 'float16' is for 'encoding_format': 'base64' (JSON numbers are written as "
            "float32); send both, or drop 'dtype'.",
            param="dtype",
        )
    return Format(fmt == "base64", dtype == "float16")


def _texts(obj: dict[str, Any], limit: int, what: str) -> tuple[list[str], bool]:
    """``inputs`` -> ``(texts, single)``: a string (single) or an array of strings."""
    if "inputs" not in obj:
        raise ApiError(400, f"'inputs' is required: the text(s) to {what}.", param="inputs")
    value = obj["inputs"]
    req = check_inputs(value, "inputs", limit, 0, ids=False)
    return list(req.texts or []), isinstance(value, str)


def _int(obj: dict[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, got {json_kind(value)}.", param=name)
    if value < low or (high is not None and value > high):
        top = f"..{high}" if high is not None else " or more"
        raise ApiError(
            400, f"'{name}' is {shown(value, 40)}; give {low}{top}.", param=name
        )  # fmt: skip
    return value


@dataclass
class TokenRequest:
    """A checked ``/embed_all`` or ``/embed_multi_vector`` body."""

    texts: list[str]
    single: bool
    format: Format
    truncate: bool | None = None
    task: str = "document"
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = None


def check_embed_all(obj: dict[str, Any], *, limit: int) -> TokenRequest:
    """TEI's ``POST /embed_all`` body (and ``encoding_format`` / ``dtype``)."""
    check_unknown(obj, ("inputs", "truncate", "truncation_direction", *_FORMAT))
    texts, single = _texts(obj, limit, "embed")
    check_direction(obj)
    return TokenRequest(texts, single, check_format(obj), bool_field(obj, "truncate"))


def check_multi_vector(
    obj: dict[str, Any], *, limit: int, width: int, prompts: dict[str, Any]
) -> TokenRequest:
    """``POST /embed_multi_vector``: a multi-vector model's token rows of queries or
    documents (``task``), with the folder's prompt for the task unless ``prompt`` /
    ``prompt_name`` say otherwise."""
    check_unknown(
        obj,
        (
            "inputs", "task", "prompt_name", "prompt", "truncate", "truncation_direction",
            "dimensions", *_FORMAT,
        ),
    )  # fmt: skip
    texts, single = _texts(obj, limit, "embed")
    task = obj.get("task", "document")
    if task not in ("query", "document"):
        got = shown(task, 60) if isinstance(task, str) else json_kind(task)
        raise ApiError(400, f"'task' is {got}; use 'query' or 'document'.", param="task")
    name, prompt = obj.get("prompt_name"), obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ApiError(400, f"'prompt' must be a string, got {json_kind(prompt)}.", param="prompt")
    if name is not None and (not isinstance(name, str) or name not in prompts):
        got = shown(name, 60) if isinstance(name, str) else json_kind(name)
        raise ApiError(
            400,
            f"'prompt_name' is {got}; this model's prompts are {sorted(prompts)}.",
            param="prompt_name",
        )
    check_direction(obj)
    return TokenRequest(
        texts, single, check_format(obj), bool_field(obj, "truncate"), task, name, prompt,
        _int(obj, "dimensions", 1, width),
    )  # fmt: skip


@dataclass
class Decode:
    """A checked ``POST /decode``: the id lists and whether special tokens are dropped."""

    ids: list[list[int]]
    skip_special_tokens: bool


def check_decode(obj: dict[str, Any], *, limit: int, vocab: int, most: int) -> Decode:
    """TEI's ``POST /decode`` body: ``ids`` as one array of token ids or an array of them, at
    most ``most`` ids in all (413 before any is looked at)."""
    check_unknown(obj, ("ids", "skip_special_tokens"))
    if "ids" not in obj:
        raise ApiError(400, "'ids' is required: the token ids to decode.", param="ids")
    value = obj["ids"]
    count = _id_count(value)
    if count > most:
        raise ApiError(
            413,
            f"'ids' holds {count} token ids, more than this server decodes in one request "
            f"({most}, --max-decode-ids): split them over several requests.",
            param="ids",
            code="request_too_large",
        )
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        req = check_inputs(value, "ids", limit, vocab, ids=True)
    elif isinstance(value, list) and value and not isinstance(value[0], list):
        req = check_inputs(value, "ids", limit, vocab, ids=True)
    else:
        got = "an empty array" if value == [] else json_kind(value)
        raise ApiError(
            400,
            f"'ids' must be an array of token ids or an array of such arrays, got {got}.",
            param="ids",
        )
    if req.ids is None:  # strings where ids were expected
        raise ApiError(
            400, "'ids' holds strings; send token ids (integers).", param="ids"
        )  # fmt: skip
    skip = bool_field(obj, "skip_special_tokens")
    return Decode(req.ids, True if skip is None else skip)


def _id_count(value: object) -> int:
    """How many ids a ``/decode`` body's ``ids`` holds (0 for a shape that is not ids)."""
    if not isinstance(value, list):
        return 0
    return sum(len(v) if isinstance(v, list) else 1 for v in value)


@dataclass
class LateChunks:
    """A checked ``POST /embed_late_chunks``: the text, its spans (checked against it) and
    the pooling options (None: the folder's)."""

    text: str
    spans: list[tuple[int, int]]
    format: Format
    pooling: str | None = None
    normalize: bool | None = None
    overlap: int | None = None


def check_late_chunks(obj: dict[str, Any], *, limit: int) -> LateChunks:
    """``{"text", "spans": [[start, end], ...]}``: spans are character offsets into the text
    (end excluded), in order of their start; ``pooling`` ``"mean"`` / ``"max"``;
    ``normalize``; ``overlap`` (tokens two windows share when the text is longer than the
    model)."""
    from ..arguments import ArgumentTypeError
    from ..encoder.late_chunks import check_spans

    check_unknown(obj, ("text", "spans", "pooling", "normalize", "overlap", *_FORMAT))
    text = obj.get("text")
    if not isinstance(text, str):
        got = "missing" if "text" not in obj else json_kind(text)
        raise ApiError(
            400, f"'text' must be a string (the whole document), got {got}.", param="text"
        )
    spans = obj.get("spans")
    if not isinstance(spans, list):
        got = "missing" if "spans" not in obj else json_kind(spans)
        raise ApiError(
            400,
            f"'spans' must be an array of [start, end] character offsets into 'text', got "
            f"{got}; e.g. [[0, 120], [120, 240]].",
            param="spans",
        )
    if len(spans) > limit:
        raise ApiError(
            413,
            f"'spans' has {len(spans)} spans; this server takes at most {limit} per request "
            f"(--max-request-inputs): split the request.",
            param="spans",
            code="too_many_inputs",
        )
    for i, span in enumerate(spans):  # JSON's types first: check_spans takes Python's
        if not (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
        ):
            raise ApiError(
                400,
                f"'spans[{i}]' is {json_kind(span) if not isinstance(span, list) else 'an array'}"
                f" of {len(span) if isinstance(span, list) else 'no'} values; a span is "
                f"[start, end], two integers.",
                param=f"spans[{i}]",
            )
    try:
        checked = check_spans(spans, text)
    except (ArgumentTypeError, ValueError) as exc:
        message = str(exc)
        where = message.split(" ", 1)[0] if message.startswith("spans[") else "spans"
        raise ApiError(400, message, param=where) from None
    pooling = obj.get("pooling")
    if pooling is not None and pooling not in ("mean", "max"):
        got = shown(pooling, 60) if isinstance(pooling, str) else json_kind(pooling)
        raise ApiError(
            400,
            f"'pooling' is {got}; use 'mean' or 'max' (one [CLS] for the whole text says "
            f"nothing per span).",
            param="pooling",
        )
    return LateChunks(
        text,
        checked,
        check_format(obj),
        pooling,
        bool_field(obj, "normalize"),
        _int(obj, "overlap", 0),
    )


@dataclass
class M3Request:
    """A checked ``POST /embed_m3``: texts, which outputs, ``max_length``, ``truncate``."""

    texts: list[str]
    single: bool
    format: Format
    flags: tuple[str, ...]
    max_length: int | None = None
    truncate: bool | None = None


def check_m3(obj: dict[str, Any], *, limit: int) -> M3Request:
    """``POST /embed_m3``: bge-m3's outputs, FlagEmbedding's flags and defaults (dense only
    unless asked)."""
    check_unknown(
        obj,
        (
            "inputs", "return_dense", "return_sparse", "return_colbert_vecs", "max_length",
            "truncate", "truncation_direction", *_FORMAT,
        ),
    )  # fmt: skip
    texts, single = _texts(obj, limit, "embed")
    flags = []
    for name, key, default in (
        ("return_dense", "dense", True),
        ("return_sparse", "lexical", False),
        ("return_colbert_vecs", "colbert", False),
    ):
        given = bool_field(obj, name)
        if default if given is None else given:
            flags.append(key)
    if not flags:
        raise ApiError(
            400,
            "'return_dense', 'return_sparse' and 'return_colbert_vecs' are all false: ask for "
            "at least one output.",
            param="return_dense",
        )
    check_direction(obj)
    return M3Request(
        texts, single, check_format(obj), tuple(flags), _int(obj, "max_length", 3),
        bool_field(obj, "truncate"),
    )  # fmt: skip
