"""`bertattn serve --access-log` (and `-v`): one line per request, as Text Embeddings
Inference logs them: client, method and path, status, the tokens the answer reports, time.
Through a real server on a free port of 127.0.0.1 (tests/serve_server.py), reading its
stderr; the middleware's own rules in process."""

from __future__ import annotations

import logging
import re
import time

import httpx
import pytest
from serve_server import running_server

from bertattn.serve.access_log import LOGGER, AccessLog, access_line

LINE = re.compile(
    r'^bertattn serve: access: 127\.0\.0\.1 "(?P<method>\S+) (?P<path>\S+)" (?P<status>\d+|-) '
    r"(?P<tokens>\d+|-) tokens (?P<ms>\d+\.\d) ms$"
)


def access_lines(stderr: str) -> list[dict[str, str]]:
    """The access lines of ``stderr`` but the start-up's ``/live`` polls (whose last line may
    reach stderr after the test's first request)."""
    found = [m.groupdict() for m in map(LINE.match, stderr.splitlines()) if m]
    return [x for x in found if x["path"] != "/live"]


def wait_for_lines(server, n: int, timeout: float = 10) -> list[dict[str, str]]:
    """The server's access lines, once there are ``n`` (logged after the answer is sent)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = access_lines(server.stderr())
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


@pytest.mark.slow  # a real server process
def test_access_log_lines_of_a_real_server(cli_subprocess, tiny_checkpoint):
    with running_server(cli_subprocess, tiny_checkpoint, "--access-log") as server:
        before = len(access_lines(server.stderr()))  # none: the start-up only polls /live
        body = {"model": tiny_checkpoint.name, "input": ["a text", "another text here"]}
        r = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        tokens = r.json()["usage"]["total_tokens"]
        r = httpx.post(server.url + "/embed", json={"inputs": "x"}, timeout=60)
        assert r.status_code == 200, r.text
        assert httpx.get(server.url + "/no/such%7Froute", timeout=30).status_code == 404
        lines = wait_for_lines(server, before + 3)[before:]
    assert [(x["method"], x["path"], x["status"]) for x in lines] == [
        ("POST", "/v1/embeddings", "200"),
        ("POST", "/embed", "200"),
        ("GET", "/no/such\\x7froute", "404"),  # a control character escaped, not written
    ], lines
    assert lines[0]["tokens"] == str(tokens) and tokens > 0
    assert lines[1]["tokens"] == "-" and lines[2]["tokens"] == "-"  # no usage in the answer
    assert all(float(x["ms"]) > 0 for x in lines)


@pytest.mark.slow  # a real server process
def test_no_access_log_without_the_flag_or_v(cli_subprocess, tiny_checkpoint):
    with running_server(cli_subprocess, tiny_checkpoint) as server:
        body = {"model": tiny_checkpoint.name, "input": ["a text"]}
        assert httpx.post(server.url + "/v1/embeddings", json=body, timeout=60).status_code == 200
        time.sleep(0.5)
        assert "access:" not in server.stderr() and '"POST /v1/embeddings"' not in server.stderr()


def test_the_line_says_method_path_status_tokens_and_time():
    assert access_line("10.0.0.2", "POST", "/embed", 200, 14, 0.01234) == (
        '10.0.0.2 "POST /embed" 200 14 tokens 12.3 ms'
    )
    assert access_line("c", "GET", "/live", None, None, 0.0) == 'c "GET /live" - - tokens 0.0 ms'
    long = access_line("c", "GET", "/" + "a" * 500, 404, None, 0.0)
    assert len(long) < 300 and "(501 characters)" in long  # clipped, the length said


async def _call(app, path: str = "/x") -> None:
    scope = {"type": "http", "method": "POST", "path": path, "client": ("127.0.0.1", 5)}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await AccessLog(app)(scope, receive, send)


def test_the_middleware_reads_usage_and_logs_at_info(caplog):
    import asyncio

    async def app(scope, receive, send):  # an answer in two pieces, usage at its end
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"data": [1, 2], ', "more_body": True})
        await send({"type": "http.response.body", "body": b'"usage": {"total_tokens": 7}}'})

    with caplog.at_level(logging.INFO, logger=LOGGER):
        asyncio.run(_call(app))
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert re.fullmatch(r'127\.0\.0\.1 "POST /x" 200 7 tokens \d+\.\d ms', record.getMessage())

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # INFO off: nothing said
        asyncio.run(_call(app))
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_a_request_that_fails_is_still_logged(caplog):
    import asyncio

    async def app(scope, receive, send):
        raise RuntimeError("boom")

    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(RuntimeError):
        asyncio.run(_call(app, "/boom"))
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.getMessage().startswith('127.0.0.1 "POST /boom" - - tokens ')
