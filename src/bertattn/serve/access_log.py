"""One log line per HTTP request of ``bertattn serve``, as Text Embeddings Inference logs them:
an ASGI middleware (:class:`AccessLog`) that writes, at INFO on the logger
``bertattn.serve.access``::

    127.0.0.1 "POST /v1/embeddings" 200 14 tokens 12.3 ms

the client's address, the method and path (no query string; clipped, control characters
escaped), the status (``-`` when the request ended before an answer began: a client that
left, a cancelled request), the tokens the answer's ``usage`` reports (``-`` for a route that
reports none, such as ``/embed`` or ``/live``) and the time from the request to the answer's
last byte. ``bertattn serve -v`` shows the lines with the rest of the INFO log, and
``bertattn serve --access-log`` shows them alone. Nothing is read or kept when INFO is off:
the check is one ``isEnabledFor`` per request.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from .errors import clip

__all__ = ["LOGGER", "AccessLog", "access_line"]

#: the logger the lines go to
LOGGER = "bertattn.serve.access"
logger = logging.getLogger(LOGGER)

#: the last bytes of an answer kept to read its ``usage`` (the last key the routes write)
_TAIL = 256
_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
#: the longest path a line shows
_PATH_CHARS = 200


def access_line(
    client: str, method: str, path: str, status: int | None, tokens: int | None, seconds: float
) -> str:
    """The line for one request (see the module docstring)."""
    shown = clip(path.encode("unicode_escape").decode("ascii"), _PATH_CHARS)
    return (
        f'{client} "{clip(method, 20)} {shown}" {"-" if status is None else status} '
        f"{'-' if tokens is None else tokens} tokens {seconds * 1e3:.1f} ms"
    )


class AccessLog:
    """ASGI middleware: one :func:`access_line` per HTTP request, at INFO on
    :data:`LOGGER`, once the answer has been sent (or the request has ended without one)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None
        tail = b""

        async def sending(message: Any) -> None:
            nonlocal status, tail
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                tail = (tail + bytes(message.get("body", b"")))[-_TAIL:]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            found = _TOKENS.search(tail)
            client = scope.get("client") or ("-", 0)
            logger.info(
                "%s",
                access_line(
                    str(client[0]),
                    str(scope.get("method", "-")),
                    str(scope.get("path", "")),
                    status,
                    int(found.group(1)) if found else None,
                    time.perf_counter() - start,
                ),
            )
