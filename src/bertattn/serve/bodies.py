"""Request bodies: read within the size limit, parsed as JSON, checked field by field.

Every refusal is an :class:`~.errors.ApiError` whose message names the field (``param``), what
came and what is expected; nothing here touches the model or the queue.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from ..encoder.jsonfile import json_type
from .errors import ApiError, clip, shown

try:
    import orjson
except ImportError:  # the json module alone: slower on large bodies, the same values
    orjson = None  # type: ignore[assignment]

#: the field checks the head routes' bodies (:mod:`.head_bodies`) share with these
__all__ = [
    "EmbedRequest",
    "bool_field",
    "check_count",
    "check_direction",
    "check_inputs",
    "check_openai",
    "check_tei",
    "check_tokenize",
    "check_unknown",
    "json_kind",
    "parse_json",
]

_JSON_TYPES = ("application/json",)
#: a JSON escape of a UTF-16 surrogate: only these can put a lone surrogate into parsed text
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: bodies larger than this are parsed with orjson when it is installed (~6x faster than json on
#: 16 MB of token ids: 0.16 s against 0.9 s, time the parse holds the interpreter)
_ORJSON_BYTES = 64 << 10
#: 19 digits in a row: an integer orjson may read as a float (beyond 64 bits): json reads those
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def check_direction(obj: dict[str, Any]) -> None:
    """A 400 unless the body's ``truncation_direction`` is absent or ``right`` (TEI's field:
    bertattn cuts the end of a long input, never its start)."""
    direction = obj.get("truncation_direction")
    if direction is not None and direction not in ("right", "Right"):
        raise ApiError(
            400,
            "'truncation_direction' must be 'right' (the end of a long input is cut).",
            param="truncation_direction",
        )


#: :func:`~bertattn.encoder.jsonfile.json_type`'s names as a message says them
_KINDS = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "a number",
    "number": "a number",
    "non-finite number": "a number",
    "string": "a string",
    "array": "an array",
}


def json_kind(value: object) -> str:
    """The JSON name of a value's type, for messages ("a string", "an array", ...)."""
    return _KINDS.get(json_type(value), "an object")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The body as a JSON object (415: not JSON; 400: invalid UTF-8, malformed or too deep JSON,
    not an object)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in _JSON_TYPES:
        raise ApiError(
            415,
            f"Content-Type {clip(content_type or '(none)')} is not supported; send the body as "
            f"JSON with 'Content-Type: application/json'.",
            code="unsupported_media_type",
        )
    if orjson is not None and len(body) > _ORJSON_BYTES and not _LONG_DIGITS.search(body):
        try:
            fast = orjson.loads(body)  # refuses lone surrogates, NaN, invalid UTF-8
        except orjson.JSONDecodeError:
            pass  # json below says what is wrong, in its words
        else:
            if isinstance(fast, dict):
                return fast
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400,
            f"the body is not valid UTF-8 (byte {exc.start}: {body[exc.start : exc.start + 1]!r}); "
            f"JSON bodies must be UTF-8.",
            code="invalid_json",
        ) from None
    if not text.strip():
        raise ApiError(400, "the body is empty; send a JSON object.", code="invalid_json")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(
            400, "the JSON body is nested too deeply; send a flat JSON object.", code="invalid_json"
        ) from None
    except ValueError as exc:  # JSONDecodeError, an int of too many digits, NaN
        raise ApiError(
            400, f"the body is not valid JSON: {clip(str(exc))}.", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise ApiError(
            400, f"the body must be a JSON object, got {json_kind(value)}.", code="invalid_json"
        )
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        _no_lone_surrogates(value)
    return value


def _lone(text: str) -> int | None:
    """The index of the first lone UTF-16 surrogate in ``text`` (None: none)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _no_lone_surrogates(obj: dict[str, Any]) -> None:
    """400 naming the first string (value or key) that holds a lone surrogate (``"\\ud800"``
    escaped in the JSON): no text can be tokenized, nor echoed, with one."""
    stack: list[tuple[str, object]] = [(k, v) for k, v in reversed(obj.items())]
    for key in obj:
        at = _lone(key)
        if at is not None:
            stack = [(key, key)]
            break
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            at = _lone(value)
            if at is not None:
                raise ApiError(
                    400,
                    f"'{clip(where)}' holds a lone UTF-16 surrogate "
                    f"({clip(value[at])} at character {at}); text must be valid Unicode: send a "
                    f"surrogate pair, or drop the character.",
                    param=where,
                    code="invalid_text",
                )
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, dict):
            for key in value:
                if _lone(key) is not None:
                    stack.append((f"{where}.{key}", key))
                    break
            else:
                stack += [(f"{where}.{k}", v) for k, v in reversed(value.items())]


@dataclass
class EmbedRequest:
    """A checked request: ``texts`` or ``ids`` (token-id inputs), and what to do with them."""

    texts: list[str] | None
    ids: list[list[int]] | None
    base64: bool = False
    dimensions: int | None = None
    normalize: bool | None = None  # None: as the model folder says
    truncate: bool | None = None  # None: the server's setting
    model: str | None = None


def check_unknown(obj: dict[str, Any], known: tuple[str, ...]) -> None:
    extra = [k for k in obj if k not in known]
    if extra:
        raise ApiError(
            400,
            f"unrecognized request argument supplied: {shown(extra[0])}; this route takes "
            f"{', '.join(known)}.",
            param=clip(extra[0]),
            code="unknown_parameter",
        )


def check_count(n: int, limit: int, name: str) -> None:
    if n == 0:
        raise ApiError(400, f"'{name}' is an empty array; give at least one input.", param=name)
    if n > limit:
        raise ApiError(
            413,
            f"'{name}' has {n} inputs; this server takes at most {limit} per request "
            f"(--max-request-inputs): split the request.",
            param=name,
            code="too_many_inputs",
        )


def check_inputs(value: object, name: str, limit: int, vocab: int, *, ids: bool) -> EmbedRequest:
    """``str | list[str]`` (and with ``ids``: ``list[int] | list[list[int]]``)."""
    forms = "a string or an array of strings" + (
        ", or token ids (an array of integers, or an array of such arrays)" if ids else ""
    )
    if isinstance(value, str):
        return EmbedRequest([value], None)
    if not isinstance(value, list):
        raise ApiError(400, f"'{name}' must be {forms}, got {json_kind(value)}.", param=name)
    if ids and value and isinstance(value[0], int) and not isinstance(value[0], bool):
        return EmbedRequest(None, [_token_ids(value, name, vocab)])  # one input of token ids
    check_count(len(value), limit, name)
    first = value[0]
    if isinstance(first, str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise ApiError(
                    400,
                    f"'{name}[{i}]' is {json_kind(v)}; an array of inputs must hold only strings "
                    f"(or only token ids).",
                    param=f"{name}[{i}]",
                )
        return EmbedRequest(list(value), None)
    if not ids:
        what = json_kind(first)
        raise ApiError(400, f"'{name}[0]' is {what}; expected {forms}.", param=f"{name}[0]")
    if isinstance(first, list):
        out = []
        for i, v in enumerate(value):
            where = f"{name}[{i}]"
            if not isinstance(v, list):
                what = json_kind(v)
                raise ApiError(
                    400, f"'{where}' is {what}; expected an array of token ids.", param=where
                )
            out.append(_token_ids(v, where, vocab))
        return EmbedRequest(None, out)
    raise ApiError(400, f"'{name}[0]' is {json_kind(first)}; expected {forms}.", param=f"{name}[0]")


def _token_ids(value: list[Any], where: str, vocab: int) -> list[int]:
    """``value`` when it holds only token ids (ints in ``0..vocab-1``), else 400 naming the
    first that is not. The check runs in C (``map``, ``set``, ``min``, ``max``): a 16 MB body of
    ids is ~0.1 s of it, not the seconds of a Python loop over every id."""
    if not value:
        raise ApiError(400, f"'{where}' is an empty array of token ids.", param=where)
    if set(map(type, value)) == {int} and min(value) >= 0 and max(value) < vocab:
        return value
    for j, t in enumerate(value):
        if type(t) is not int or not 0 <= t < vocab:
            got = shown(t, 40) if isinstance(t, (int, float)) else json_kind(t)
            raise ApiError(
                400,
                f"'{where}[{j}]' is {got}; a token id is an integer in 0..{vocab - 1} (this "
                f"model's vocabulary; POST /tokenize gives a text's ids).",
                param=f"{where}[{j}]",
            )
    return list(value)


def bool_field(obj: dict[str, Any], name: str) -> bool | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json_kind(value)}.", param=name)
    return value


def _dimensions(obj: dict[str, Any], width: int) -> int | None:
    value = obj.get("dimensions")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(
            400, f"'dimensions' must be an integer, got {json_kind(value)}.", param="dimensions"
        )
    if not 1 <= value <= width:
        raise ApiError(
            400,
            f"'dimensions' is {shown(value, 40)}; this model's embeddings have {width} "
            f"dimensions: give 1..{width}.",
            param="dimensions",
        )
    return value


def check_model(model: object, names: tuple[str, ...]) -> None:
    """A body's ``model``: a string (400) naming a model this server serves (404)."""
    if not isinstance(model, str):
        raise ApiError(400, f"'model' must be a string, got {json_kind(model)}.", param="model")
    if model not in names:
        raise ApiError(
            404,
            f"The model {shown(model)} does not exist here; this server serves {names[0]!r}.",
            param="model",
            code="model_not_found",
        )


def check_openai(
    obj: dict[str, Any], *, names: tuple[str, ...], width: int, limit: int, vocab: int
) -> EmbedRequest:
    """OpenAI's ``POST /v1/embeddings`` body: ``input``, ``model``, ``encoding_format``,
    ``dimensions``, ``user``. ``names``: the model names served (the first is the canonical)."""
    check_unknown(obj, ("input", "model", "encoding_format", "dimensions", "user"))
    if "input" not in obj:
        raise ApiError(400, "'input' is required: the text(s) to embed.", param="input")
    req = check_inputs(obj["input"], "input", limit, vocab, ids=True)
    model = obj.get("model")
    if model is None:
        raise ApiError(400, f"'model' is required; this server serves {names[0]!r}.", param="model")
    check_model(model, names)
    fmt = obj.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        got = shown(fmt, 60) if isinstance(fmt, str) else json_kind(fmt)
        raise ApiError(
            400,
            f"'encoding_format' is {got}; use 'float' or 'base64'.",
            param="encoding_format",
        )
    user = obj.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, f"'user' must be a string, got {json_kind(user)}.", param="user")
    req.base64 = fmt == "base64"
    req.dimensions = _dimensions(obj, width)
    req.model = model
    return req


def check_tei(obj: dict[str, Any], *, width: int, limit: int) -> EmbedRequest:
    """Text Embeddings Inference's ``POST /embed`` body: ``inputs``, ``normalize`` (default
    true), ``truncate``, ``truncation_direction`` (right only), ``dimensions``."""
    check_unknown(obj, ("inputs", "normalize", "truncate", "truncation_direction", "dimensions"))
    if "inputs" not in obj:
        raise ApiError(400, "'inputs' is required: the text(s) to embed.", param="inputs")
    req = check_inputs(obj["inputs"], "inputs", limit, 0, ids=False)
    normalize = bool_field(obj, "normalize")
    req.normalize = True if normalize is None else normalize
    req.truncate = bool_field(obj, "truncate")
    check_direction(obj)
    req.dimensions = _dimensions(obj, width)
    return req


def check_tokenize(obj: dict[str, Any], *, limit: int) -> tuple[EmbedRequest, bool]:
    """``POST /tokenize``: ``inputs``, ``add_special_tokens`` (default true)."""
    check_unknown(obj, ("inputs", "add_special_tokens"))
    if "inputs" not in obj:
        raise ApiError(400, "'inputs' is required: the text(s) to tokenize.", param="inputs")
    req = check_inputs(obj["inputs"], "inputs", limit, 0, ids=False)
    special = bool_field(obj, "add_special_tokens")
    return req, True if special is None else special


def request_timeout(value: str | None) -> float | None:
    """``X-Request-Timeout: SECONDS`` (a positive number) -> seconds, or None."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ApiError(
            400,
            f"X-Request-Timeout {shown(value, 40)} is not a number of seconds > 0.",
            param="X-Request-Timeout",
        )
    return seconds
