"""Connections under abuse: uvicorn's h11 protocol with a time limit on request headers and a cap
on open connections, each cut counted in ``/metrics``.

uvicorn times a keep-alive connection out only after a response (``timeout_keep_alive``), and
stops that timer at the first byte: a fresh connection that sends nothing, or headers one byte at
a time, would stay open for ever, and enough of them use up the process's open files. Here a
timer starts when a connection opens and after each response, and stops when a request's
headers are complete: ``header_timeout`` seconds later the connection is closed (a 408 in the
error envelope when part of a request came, nothing when nothing did). A connection past
``max_connections`` open gets 503 and is closed at once. The body has its own limit in the app
(``body_timeout_s``, 408).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .encoding import dumps
from .errors import envelope
from .telemetry import ServeMetrics

__all__ = ["guarded_protocol"]


def _raw(status: str, message: str, code: str, type: str) -> bytes:
    """A whole HTTP/1.1 answer in the error envelope that closes the connection (written as
    bytes: no request was parsed to answer through h11)."""
    body = dumps(envelope(message, type, None, code))
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status.startswith("503"):
        head += "retry-after: 1\r\n"
    return head.encode("ascii") + b"\r\n" + body


def _answers(header_timeout: float, max_connections: int) -> tuple[bytes, bytes]:
    """The raw 503 (past ``max_connections``) and 408 (headers late) answers."""
    refused = _raw(
        "503 Service Unavailable",
        f"this server holds its limit of {max_connections} connections (--max-connections); "
        f"retry after 1 s, or reuse a connection.",
        "too_many_connections",
        "server_unavailable",
    )
    late = _raw(
        "408 Request Timeout",
        f"the request headers did not arrive within {header_timeout:g} s (--header-timeout); "
        f"send them whole.",
        "header_timeout",
        "timeout_error",
    )
    return refused, late


def guarded_protocol(
    metrics: ServeMetrics, header_timeout: float, max_connections: int
) -> type[H11Protocol]:
    """uvicorn's ``H11Protocol`` (pass as ``uvicorn.Config(http=...)``) that closes a
    connection whose request headers are not complete ``header_timeout`` seconds after it
    opened or after its last response, refuses connections past ``max_connections`` (503),
    and keeps ``metrics.open_connections`` and ``metrics.connections_closed`` up to date."""
    refused, late = _answers(header_timeout, max_connections)

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _heard = False  # bytes came since the timer started

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            metrics.open_connections = len(self.connections)
            if len(self.connections) > max_connections:
                metrics.connections_closed.inc("over_limit")
                transport.write(refused)
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
            metrics.open_connections = len(self.connections)

        def _busy(self) -> bool:
            """A request's headers are complete and its answer is not: the app has it (and
            times its body)."""
            return self.cycle is not None and not self.cycle.response_complete

        def data_received(self, data: bytes) -> None:
            self._heard = True
            super().data_received(data)
            if self._timer is not None and self._busy():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request
            if not self.transport.is_closing() and not self._busy():
                self._arm()

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                metrics.connections_closed.inc("idle")
            super().timeout_keep_alive_handler()

        def _arm(self) -> None:
            self._disarm()
            self._heard = False
            self._timer = self.loop.call_later(header_timeout, self._header_timeout)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _header_timeout(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._busy():
                return
            if self._heard and self.conn.their_state is not h11.ERROR:
                metrics.connections_closed.inc("header_timeout")
                self.transport.write(late)
            else:
                metrics.connections_closed.inc("idle")
            self.transport.close()

    return GuardedH11Protocol
