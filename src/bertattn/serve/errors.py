"""Refusals the server answers with, in OpenAI's error envelope.

``{"error": {"message", "type", "param", "code"}}``: every 4xx / 5xx body of every route has
this shape (the TEI-style routes too), so one client-side handler reads them all.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "clip", "envelope", "shown"]

#: characters of client input a message echoes at most (then "…" and the length)
ECHO_CHARS = 100


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as a message may carry it: at most ``limit`` characters (then ``…`` and the
    full length), lone surrogates written as ``\\udXXX`` (they cannot be encoded as UTF-8)."""
    out = text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
    return out.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value as a message echoes it, in JSON's words (``true``, ``null``, a string
    in quotes), never longer than about ``limit`` characters; arrays and objects by kind."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        try:
            digits = str(value)
        except ValueError:  # more digits than Python converts
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
        if len(digits) > limit:
            return f"{digits[:limit]}… (an integer of {len(digits)} digits)"
        return digits
    if isinstance(value, float):
        return clip(repr(value), limit)
    if isinstance(value, str):
        if len(value) > limit:
            return f"'{clip(value[:limit])}…' ({len(value)} characters)"
        return f"'{clip(value)}'"
    return "an array" if isinstance(value, list) else "an object"


#: HTTP status -> OpenAI's error ``type``
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An HTTP error answer: ``status``, a ``message`` that says what came, what was expected
    and the fix, the request ``param`` at fault (JSON path such as ``input[3]``; None when no
    field is), a machine-readable ``code`` and extra response ``headers``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.reason = reason or code or "invalid"  # the /metrics label of a rejection

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return envelope(self.message, self.type, self.param, self.code)


def envelope(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``; the message
    and the param can always be encoded (a lone surrogate is written out as ``\\udXXX``)."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if param is not None:
        param = clip(param, 2 * ECHO_CHARS)
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
