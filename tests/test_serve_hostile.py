"""The server's own hostile suite: what a hostile client found ("Promises under abuse"), each a
test on a real ``bertattn serve`` (one per module where the server survives the test): lone
surrogates, event-loop stalls, idle and slow connections, 405 without ``Allow``, unbounded
echoes, /info without the key, Content-Encoding, the drain's answers, one request holding the
tokenizer. Traffic goes to 127.0.0.1 only, bounded in count and time."""

from __future__ import annotations

import gzip
import json
import shutil
import signal
import socket
import threading
import time

import httpx
import pytest
from serve_server import (
    FileLimited,
    error_envelope,
    metrics,
    running_server,
    wait_live,
    wait_queued,
)

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json", **AUTH}


def _count(metrics: dict[str, float], route: str, status: int) -> float:
    return metrics.get(f'bertattn_requests_total{{route="{route}",status="{status}"}}', 0.0)


@pytest.fixture(scope="module")
def server(cli_subprocess, tiny_checkpoint):  # type: ignore[no-untyped-def]
    args = ("--threads", "1", "--api-key", KEY, "--max-body-size", "32M")
    with running_server(cli_subprocess, tiny_checkpoint, *args) as s:
        s.name = tiny_checkpoint.name
        yield s


# ---------------------------------------------------------------------- 1. lone surrogates
SURROGATES = [
    ("/v1/embeddings", "embeddings", b'{"model": "@", "input": "\\ud800"}', "input"),
    ("/v1/embeddings", "embeddings", b'{"model": "@", "input": ["ok", "a\\udc00b"]}', "input[1]"),
    ("/v1/embeddings", "embeddings", b'{"model": "@", "input": "hi", "\\ud800": 1}', "\\ud800"),
    ("/embed", "embed", b'{"inputs": "\\udbff"}', "inputs"),
    ("/embed", "embed", b'{"inputs": "hi", "\\udfff": 1}', "\\udfff"),
    ("/tokenize", "tokenize", b'{"inputs": ["x", "y", "\\ud800"]}', "inputs[2]"),
]


@pytest.mark.parametrize("case", SURROGATES, ids=[c[3] + c[0] for c in SURROGATES])
def test_lone_surrogate_is_400_naming_the_param_and_counted_as_such(server, case):
    path, route, body, param = case
    before = metrics(server)
    body = body.replace(b'"@"', json.dumps(server.name).encode())
    r = httpx.post(server.url + path, content=body, headers=JSON, timeout=30)
    assert r.status_code == 400, r.text[:300]
    error = error_envelope(r)
    assert error["param"] == param and error["code"] in ("invalid_text", "unknown_parameter")
    after = metrics(server)
    assert _count(after, route, 400) == _count(before, route, 400) + 1  # what the client got
    assert _count(after, route, 500) == _count(before, route, 500)


def test_a_surrogate_pair_is_text_not_an_error(server):
    body = b'{"model": @, "input": "smile \\ud83d\\ude00"}'  # a pair of escapes: one character
    body = body.replace(b"@", json.dumps(server.name).encode())
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers=JSON, timeout=30)
    assert r.status_code == 200, r.text[:300]


# ---------------------------------------------------------------------- 4. 404 / 405
def test_405_says_allow_and_404_405_are_counted(server):
    before = metrics(server)
    r = httpx.get(server.url + "/v1/embeddings", headers=AUTH, timeout=10)
    assert r.status_code == 405 and "POST" in r.headers.get("allow", ""), r.headers
    assert error_envelope(r)["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/live", timeout=10)
    assert r.status_code == 405 and "GET" in r.headers.get("allow", ""), r.headers
    r = httpx.get(server.url + "/no/such/route", timeout=10)
    assert r.status_code == 404
    after = metrics(server)
    assert _count(after, "unmatched", 405) == _count(before, "unmatched", 405) + 2
    assert _count(after, "unmatched", 404) == _count(before, "unmatched", 404) + 1


# ---------------------------------------------------------------------- 5. bounded echoes
def test_an_unknown_900k_key_is_not_echoed_whole(server):
    key = "k" * 900_000
    body = b'{"model": "x", "input": "a", "' + key.encode() + b'": 1}'
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers=JSON, timeout=30)
    assert r.status_code == 400
    assert len(r.content) < 2000, len(r.content)
    error = error_envelope(r)
    assert "900000 characters" in error["message"] and "…" in error["message"]
    assert len(error["param"]) <= 200


def test_dimensions_of_4300_digits_is_not_echoed_whole(server):
    body = b'{"model": "@", "input": "a", "dimensions": ' + b"7" * 4300 + b"}"
    body = body.replace(b'"@"', json.dumps(server.name).encode())
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers=JSON, timeout=30)
    assert r.status_code == 400, r.text[:300]
    error = error_envelope(r)
    assert error["param"] == "dimensions" and len(error["message"]) < 400, error
    assert "4300 digits" in error["message"]


def test_a_boolean_token_id_is_shown_in_json_words(server):
    body = {"model": server.name, "input": [[5, True, 7]]}
    r = httpx.post(server.url + "/v1/embeddings", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400
    error = error_envelope(r)
    assert error["param"] == "input[0][1]" and "True" not in error["message"], error
    assert "'input[0][1]' is true" in error["message"], error


@pytest.mark.parametrize(
    "field",
    [
        {"model": "m" * 50_000},
        {"encoding_format": "f" * 50_000},
    ],
    ids=["model", "encoding_format"],
)
def test_long_string_fields_are_echoed_capped(server, field):
    body = {"model": server.name, "input": "a", **field}
    r = httpx.post(server.url + "/v1/embeddings", json=body, headers=AUTH, timeout=30)
    assert r.status_code in (400, 404)
    assert len(error_envelope(r)["message"]) < 400, r.text[:500]


def test_a_long_content_type_is_echoed_capped(server):
    headers = {**AUTH, "content-type": "text/" + "x" * 5000}
    r = httpx.post(server.url + "/v1/embeddings", content=b"{}", headers=headers, timeout=30)
    assert r.status_code == 415 and len(error_envelope(r)["message"]) < 400, r.text[:500]


# ---------------------------------------------------------------------- 6. /info, encodings
def test_info_needs_the_key_when_one_is_set(server):
    assert httpx.get(server.url + "/info", timeout=10).status_code == 401
    bad = httpx.get(server.url + "/info", headers={"Authorization": "Bearer no"}, timeout=10)
    assert bad.status_code == 401
    r = httpx.get(server.url + "/info", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["auth"] is True
    for open_path in ("/live", "/ready", "/health", "/metrics"):  # still open
        assert httpx.get(server.url + open_path, timeout=10).status_code == 200, open_path


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "GZIP"])
def test_a_content_encoding_is_415(server, coding):
    plain = json.dumps({"model": server.name, "input": "hello"}).encode()
    for body in (plain, gzip.compress(plain)):  # labelled right, and plain JSON labelled so
        headers = {**JSON, "content-encoding": coding}
        r = httpx.post(server.url + "/v1/embeddings", content=body, headers=headers, timeout=30)
        assert r.status_code == 415, r.text[:300]
        assert error_envelope(r)["code"] == "unsupported_content_encoding"


def test_a_gzip_bomb_is_415_without_inflating(server):
    bomb = gzip.compress(b"[" * (64 << 20), 9)  # 64 MB inflated, ~64 KB sent
    headers = {**JSON, "content-encoding": "gzip"}
    r = httpx.post(server.url + "/v1/embeddings", content=bomb, headers=headers, timeout=30)
    assert r.status_code == 415
    ok = {**JSON, "content-encoding": "identity"}  # identity is no encoding: accepted
    body = json.dumps({"model": server.name, "input": "x"}).encode()
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers=ok, timeout=30)
    assert r.status_code == 200, r.text[:300]


# ---------------------------------------------------------------------- 2. checking token ids
# A large body of token ids is parsed and checked off the event loop: the threads each step runs
# on are checked in test_serve_units.py (a timing here would measure the machine's load; the
# longest /live wait is measured by ``python -m benchmarks.serve_stalls``).


# ---------------------------------------------------------------------- 7. tokenizer fairness
@pytest.mark.slow
def test_a_small_request_is_not_held_by_a_large_one_tokenizing(server):
    """2,048 texts of ~7,800 characters (~15 MB) take seconds to tokenize; a 3-word request
    sent meanwhile waits for one chunk of them, not for all: it is answered while the large
    one is still being worked on, in a small part of the large one's time (before chunking it
    waited for the whole tokenization, about half of that time). Relative, so that a loaded
    machine slows both alike."""
    texts = [f"the attention head looks at token {i} " * 200 for i in range(2048)]
    big = {"model": server.name, "input": texts}
    answer: dict = {}

    def post_big() -> None:
        t0 = time.monotonic()
        answer["r"] = httpx.post(server.url + "/v1/embeddings", json=big, headers=AUTH, timeout=120)
        answer["end"] = time.monotonic()
        answer["took"] = answer["end"] - t0

    worker = threading.Thread(target=post_big)
    worker.start()
    time.sleep(0.6)  # the body is read and parsed: it is tokenizing now
    small: list[tuple[float, float]] = []  # (latency, end)
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        for _ in range(3):
            t0 = time.monotonic()
            r = c.post("/tokenize", json={"inputs": "three small words"})
            assert r.status_code == 200, r.text[:300]
            small.append((time.monotonic() - t0, time.monotonic()))
            time.sleep(0.2)
    worker.join(120)
    assert answer["r"].status_code == 200, answer["r"].text[:300]
    assert answer["took"] > 1.5, answer  # it was tokenizing while the small ones came
    assert all(end < answer["end"] for _, end in small), (small, answer)
    assert max(lat for lat, _ in small) < answer["took"] / 4, (small, answer["took"])


def test_a_chunked_request_names_the_input_by_its_index_in_the_whole_request(server):
    """Tokenized in chunks of 256 texts: a too-long input at 290 is 'inputs[290]', not the
    chunk's 'inputs[34]'."""
    texts = [f"short text number {i}" for i in range(300)]  # > 4,096 characters: chunked
    texts[290] = "word " * 400  # > 128 tokens
    body = {"inputs": texts, "truncate": False}
    r = httpx.post(server.url + "/embed", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400, r.text[:300]
    error = error_envelope(r)
    assert error["param"] == "inputs[290]" and "'inputs[290]'" in error["message"], error


# ---------------------------------------------------------------------- 3. connections
HEADER_TIMEOUT = 1.0
CAP = 8


@pytest.fixture(scope="module")
def guarded(cli_subprocess, tiny_checkpoint):  # type: ignore[no-untyped-def]
    args = ("--threads", "1", "--header-timeout", HEADER_TIMEOUT, "--max-connections", CAP)
    with running_server(cli_subprocess, tiny_checkpoint, *args) as s:
        yield s


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sent before closing ``sock``, and when it closed (fails when it stays
    open ``seconds``)."""
    t0 = time.monotonic()
    got = b""
    sock.settimeout(0.2)
    while time.monotonic() - t0 < seconds:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return got, time.monotonic() - t0
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk
    pytest.fail(f"the connection was still open after {seconds} s (got {got[:200]!r})")


def _connect(server) -> socket.socket:  # type: ignore[no-untyped-def]
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def _closed(metrics: dict[str, float], reason: str) -> float:
    return metrics.get(f'bertattn_connections_closed_total{{reason="{reason}"}}', 0.0)


def test_a_silent_connection_is_closed(guarded):
    before = metrics(guarded)
    with _connect(guarded) as sock:
        got, took = _closed_within(sock, HEADER_TIMEOUT + 3)
    assert got == b"" and took >= HEADER_TIMEOUT * 0.8, (got, took)
    assert _closed(metrics(guarded), "idle") >= _closed(before, "idle") + 1


def test_trickled_headers_are_cut_with_408(guarded):
    before = metrics(guarded)
    with _connect(guarded) as sock:
        sock.sendall(b"GET /live HTTP/1.1\r\n")
        t0 = time.monotonic()
        for byte in b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 40:  # never ends
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
            sock.settimeout(0.01)
            try:
                if sock.recv(65536, socket.MSG_PEEK) is not None:
                    break  # the server answered (or closed)
            except (TimeoutError, BlockingIOError):
                pass
            if time.monotonic() - t0 > HEADER_TIMEOUT + 3:
                pytest.fail("the trickled headers were never cut")
        got, _ = _closed_within(sock, 3)
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b'"header_timeout"' in got
    assert time.monotonic() - t0 < HEADER_TIMEOUT + 3
    assert _closed(metrics(guarded), "header_timeout") >= _closed(before, "header_timeout") + 1


def test_a_kept_alive_connection_that_trickles_is_cut_too(guarded):
    with _connect(guarded) as sock:
        sock.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        sock.sendall(b"GET /li")  # the next request's headers never end
        got, took = _closed_within(sock, HEADER_TIMEOUT + 3)
    assert b"HTTP/1.1 408" in first + got, (first + got)[:400]  # after the first one's body


def test_connections_over_the_cap_get_503_and_live_comes_back(guarded):
    before = metrics(guarded)
    held = [_connect(guarded) for _ in range(CAP)]
    try:
        time.sleep(0.1)
        with _connect(guarded) as extra:
            got, _ = _closed_within(extra, 3)
        assert got.startswith(b"HTTP/1.1 503"), got[:200]
        assert b'"too_many_connections"' in got
    finally:
        for sock in held:
            sock.close()
    wait_live(guarded, 5)  # the held ones are gone: /live answers again
    after = metrics(guarded)
    assert _closed(after, "over_limit") >= _closed(before, "over_limit") + 1
    assert "bertattn_open_connections" in after


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_400_silent_sockets_under_256_files_do_not_take_live_away(cli_subprocess, tiny_checkpoint):
    """The hostile tester's case: 400 connections that send nothing, against a server allowed
    256 open files. The default cap (256 - 64 = 192) refuses the rest with 503 before the
    process runs out of files, and the header timeout cuts the silent ones: /live answers again
    while the client still holds all 400 sockets."""
    limited = FileLimited(cli_subprocess, 256)
    with running_server(limited, tiny_checkpoint, "--threads", "1", "--header-timeout", 2) as srv:
        held = []
        try:
            for _ in range(400):
                held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
            wait_live(srv, 2 + 8, poll=0.2, timeout=1)
            seen = metrics(srv)
        finally:
            for sock in held:
                sock.close()
    # at most 192 are held at once, so at least 208 of the 400 were refused over the cap or
    # cut by the header timeout (how many of each depends on how fast the 400 were opened:
    # the first ones may already have been cut when the last arrive)
    over, idle = _closed(seen, "over_limit"), _closed(seen, "idle")
    assert over >= 1 and idle >= 1, seen
    assert over + idle >= 400 - 192, seen


def test_the_default_connection_cap_stays_below_the_open_file_limit(monkeypatch):
    import resource

    from bertattn.jobs.serve import _max_connections

    assert _max_connections(50) == 50  # given: as given
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    assert _max_connections(None) == 192
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert _max_connections(None) == 1024
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    assert _max_connections(None) == 1024


@pytest.mark.parametrize(
    "field, value",
    [("header_timeout", 0), ("header_timeout", -1), ("max_connections", 0)],
)
def test_connection_options_are_checked(field, value):
    from bertattn.errors import UsageError
    from bertattn.jobs.serve_options import ServeOptions

    with pytest.raises(UsageError, match=field.replace("_", "-")):
        ServeOptions(**{field: value})


# ---------------------------------------------------------------------- 6. the drain's answers
@pytest.mark.slow
def test_a_kept_alive_request_just_after_sigterm_gets_503_close(cli_subprocess, tiny_checkpoint):
    with running_server(cli_subprocess, tiny_checkpoint, "--threads", "1") as server:
        body = {"model": tiny_checkpoint.name, "input": "late"}
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.post("/v1/embeddings", json=body).status_code == 200  # kept alive
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # the server is idle: it used to be gone by now
            r = c.post("/v1/embeddings", json=body)
        assert r.status_code == 503, r.text[:300]
        assert r.headers.get("connection") == "close"
        assert error_envelope(r)["code"] == "shutting_down"
        assert server.wait(30) == 0, server.stderr()[-2000:]


@pytest.mark.slow
def test_a_request_cut_by_a_second_signal_gets_the_503_envelope(cli_subprocess, tiny_checkpoint):
    env = {"BERTATTN_TEST_BATCH_DELAY": "0.2"}
    args = ("--max-batch-tokens", "128", "--threads", "1")
    with running_server(cli_subprocess, tiny_checkpoint, *args, env=env) as server:
        texts = [f"the attention head looks at token {i}" for i in range(1500)]  # ~30 s of work
        answer: dict = {}

        def post() -> None:
            try:
                answer["r"] = httpx.post(
                    server.url + "/v1/embeddings",
                    json={"model": tiny_checkpoint.name, "input": texts},
                    timeout=60,
                )
            except httpx.HTTPError as exc:
                answer["error"] = exc

        busy = threading.Thread(target=post)
        busy.start()
        wait_queued(server)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(30) == 1, server.stderr()[-2000:]
        busy.join(30)
        assert "r" in answer, answer
        r = answer["r"]
        assert r.status_code == 503, r.text[:300]
        assert error_envelope(r)["code"] == "shutting_down"
