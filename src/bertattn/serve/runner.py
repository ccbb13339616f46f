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

from .app import ServeState

logger = logging.getLogger("bertattn.serve")

__all__ = ["DrainingServer", "listen"]

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


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose first SIGTERM / SIGINT drains (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServeState, drain_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.signal: int | None = None
        self._drain_start = 0.0
        self.drained = True  # False: the drain timed out with requests in flight

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
