"""A minimal keep-alive HTTP/1.1 client on asyncio streams: the load generator of
``benchmarks.serve``.

Why not httpx: on the 2-core machine these benchmarks run on, the load generator shares the
cores with the server it measures, and httpx's ``AsyncClient`` took 3 ms of CPU per request at
concurrency 1-8 and 19 ms at 64 (measured by ``benchmarks.serve``'s "client ms" column),
more than the server's own per-request work. This client writes one request, reads the status
line, the headers and a ``Content-Length`` (or chunked) body, and keeps the connection: tens
of microseconds per request. It speaks only what these benchmarks send (POST of a JSON body)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

__all__ = ["Connection", "Reply"]


class Reply:
    """``status`` (int), ``headers`` (lower-case names), ``body`` (bytes)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class Connection:
    """One kept-alive connection to ``url``'s host; :meth:`post` reopens it when the server
    closed it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"an http:// URL with a host is needed, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path or "/"
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: "
        ).encode("ascii")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> Reply:
        """POST ``body`` (JSON) to the URL's path; raises ``ConnectionError`` /
        ``asyncio.IncompleteReadError`` when the connection fails (it is closed then)."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        writer.write(self._head + str(len(body)).encode("ascii") + b"\r\n\r\n" + body)
        try:
            line = await reader.readline()
            if not line:
                raise ConnectionError("the server closed the connection")
            status = int(line.split(b" ", 2)[1])
            headers: dict[str, str] = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if "content-length" in headers:
                data = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        await reader.readline()
                        break
                    chunks.append(await reader.readexactly(size))
                    await reader.readline()
                data = b"".join(chunks)
            else:
                data = await reader.read()
                headers["connection"] = "close"
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, headers, data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
