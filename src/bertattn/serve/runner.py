"""Running the app in uvicorn with a drain: SIGTERM / Ctrl-C first turn ``/ready`` and new data
requests to 503 and let the requests in flight finish (at most ``drain_timeout`` seconds), then
stop. The drain lasts at least ``DRAIN_LINGER`` seconds (``drain_timeout`` when less), so that a
request sent just after the signal on a kept-alive connection gets 503 with ``Connection:
close`` instead of a reset connection. A second signal stops at once (requests cut short get
503 in the error envelope). No signal is raised again afterwards: the caller decides
the exit status from :attr:`DrainingServer.signal`."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from .state import ServeState

logger = logging.getLogger("bertattn.serve")

__all__ = ["AcceptErrors", "DrainingServer", "listen"]

DRAIN_LINGER = 1.0  # seconds the drain lasts at least (answering 503 + Connection: close)


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free one) now, so that a port in use is
    reported before the model loads (``OSError``). It is not listening yet: until the server
    starts, a connection is refused at once instead of waiting in a backlog while the model
    loads (uvicorn's asyncio server calls ``listen``)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not TIME_WAIT's leftovers
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


#: the message asyncio's accept loop reports running out of files (EMFILE / ENFILE) or memory
_ACCEPT_OUT = "socket.accept() out of system resource"
#: at most one such log line per this many seconds (with how many were left out)
ACCEPT_LOG_EVERY = 60.0


class AcceptErrors:
    """The event loop's exception handler, for one case: ``accept()`` out of files or memory.
    asyncio pauses accepting for a second on it, but reports it (with a traceback) once per
    connection waiting in the backlog, each retry again: thousands a second under a low open-file
    limit. This logs one line (at most one per :data:`ACCEPT_LOG_EVERY` seconds, counting the
    ones left out) and leaves the pause to asyncio; any other error goes to the handler that was
    there before (asyncio's default: logged with its traceback)."""

    def __init__(self, previous: Any = None) -> None:
        self.previous = previous
        self.count = 0  # accept errors seen
        self._logged_at: float | None = None
        self._left_out = 0

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") != _ACCEPT_OUT or not isinstance(exc, OSError):
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.count += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < ACCEPT_LOG_EVERY:
            self._left_out += 1
            return
        more = f" ({self._left_out} more since the last such line)" if self._left_out else ""
        logger.warning(
            "cannot accept connections: %s; accepting is paused and retried every second. Raise "
            "the open-file limit (ulimit -n) or lower --max-connections below it%s",
            exc.strerror or exc,
            more,
        )
        self._logged_at, self._left_out = now, 0


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose first SIGTERM / SIGINT drains (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServeState, drain_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.signal: int | None = None
        self._drain_start = 0.0
        self.drained = True  # False: the drain timed out with requests in flight

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        #: accept() out of files: one line, not a traceback per waiting connection
        self.accept_errors = AcceptErrors(loop.get_exception_handler())
        loop.set_exception_handler(self.accept_errors)
        await super().startup(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.signal is not None:  # a second signal: stop now, whatever is in flight
            self.drained = self.state.in_flight == 0 and self.state.batcher.idle()
            self.state.stop_timeout = 0.0  # the worker is not waited for
            self.force_exit = self.should_exit = True
            return
        self.signal = sig
        self._drain_start = time.monotonic()
        self.state.drain()
        logger.info("signal %d: draining (at most %g s)", sig, self.drain_timeout)

    async def on_tick(self, counter: int) -> bool:
        if self.signal is not None and not self.should_exit:
            waited = time.monotonic() - self._drain_start
            idle = self.state.in_flight == 0 and self.state.batcher.idle()
            linger = min(DRAIN_LINGER, self.drain_timeout)
            if (idle and waited >= linger) or waited >= self.drain_timeout:
                self.drained = idle
                left = max(0.0, self.drain_timeout - waited)
                self.config.timeout_graceful_shutdown = max(1.0, left)
                self.state.stop_timeout = max(1.0, left)
                self.should_exit = True
        return await super().on_tick(counter)
