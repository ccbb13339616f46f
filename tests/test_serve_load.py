"""Back-pressure and lifecycle of a real ``bertattn serve`` made slow on purpose
(``BERTATTN_TEST_BATCH_DELAY``): overload answers 429 + Retry-After and every admitted request
exactly once; X-Request-Timeout and gone clients drop queued work; SIGTERM drains without
losing an admitted request and exits 0; Ctrl-C exits 130."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import httpx
import numpy as np
import pytest
from serve_server import metrics, running_server, wait_queued

pytestmark = pytest.mark.slow  # server subprocesses

DELAY = {"BERTATTN_TEST_BATCH_DELAY": "0.2"}  # seconds before each model batch
SMALL = ("--max-batch-tokens", "128", "--threads", "1")


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    from bertattn import Bert

    return Bert.load(tiny_checkpoint, threads=1)


def _texts(i: int, n: int = 5) -> list[str]:
    return [f"the attention head looks at token {i} {j}" for j in range(n)]


def _with_deadline(server, body: dict, seconds: str) -> httpx.Response:  # type: ignore[no-untyped-def]
    """``body`` to /v1/embeddings with ``X-Request-Timeout: seconds``."""
    return httpx.post(
        server.url + "/v1/embeddings",
        json=body,
        headers={"X-Request-Timeout": seconds},
        timeout=30,
    )


async def _burst(url: str, bodies: list[dict], headers: dict | None = None) -> list:
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as c:
        return await asyncio.gather(*(c.post("/v1/embeddings", json=b) for b in bodies))


@pytest.mark.parametrize(
    "cap",
    [
        ("--max-queue-tokens", "256"),  # about 4 requests of 60 tokens
        # 0.2 s a batch of one request: about one request (no floor of waiting requests)
        ("--max-queue-time", "0.3", "--min-queue-requests", "0"),
    ],
    ids=["tokens", "seconds"],
)
def test_overload_429_and_every_admitted_request_answered_once(
    cli_subprocess, tiny_checkpoint, bert, cap
):
    name = tiny_checkpoint.name
    with running_server(cli_subprocess, tiny_checkpoint, *SMALL, *cap, env=DELAY) as server:
        first = {"model": name, "input": _texts(99)}  # one batch timed: the speed is known
        assert httpx.post(server.url + "/v1/embeddings", json=first, timeout=60).status_code == 200
        bodies = [{"model": name, "input": _texts(i)} for i in range(30)]
        answers = asyncio.run(_burst(server.url, bodies))
        codes = [r.status_code for r in answers]
        assert set(codes) <= {200, 429}, codes
        assert codes.count(429) > 0 and codes.count(200) > 0, codes
        for body, r in zip(bodies, answers, strict=True):
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "queue_full"
                assert cap[0] in r.json()["error"]["message"]
                continue
            rows = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
            np.testing.assert_allclose(rows, bert.encode(body["input"]), atol=1e-6, rtol=0)
        m = metrics(server)
        admitted = codes.count(200) + 1
        assert m['bertattn_requests_total{route="embeddings",status="200"}'] == admitted
        assert m['bertattn_rejections_total{reason="queue_full"}'] == codes.count(429)
        assert m["bertattn_batch_texts_sum"] == 5 * admitted  # each input computed once
        assert m["bertattn_queue_tokens"] == 0 and m["bertattn_queue_requests"] == 0


def test_timeout_and_gone_client_drop_queued_work(cli_subprocess, tiny_checkpoint):
    name = tiny_checkpoint.name
    long = " ".join(["attention"] * 90)  # 92 tokens: one a batch (128 tokens)
    args = (*SMALL, "--max-queue-time", "0")  # admit ~2 s of queued work: tokens cap only
    with running_server(cli_subprocess, tiny_checkpoint, *args, env=DELAY) as server:
        # two requests of 5 long inputs: 10 batches, ~2 s; they take turns, and a later request
        # waits for the batch computing and one of each (>= 0.4 s, past its 0.2 s or 0.25 s)
        big = {"model": name, "input": [f"{long} {i}" for i in range(5)]}
        busy = [
            threading.Thread(
                target=lambda: httpx.post(server.url + "/v1/embeddings", json=big, timeout=60)
            )
            for _ in range(2)
        ]
        for thread in busy:
            thread.start()
        time.sleep(0.3)
        r = _with_deadline(server, {"model": name, "input": long}, "0.2")
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "timeout" and "X-Request-Timeout" in r.text
        with pytest.raises(httpx.TimeoutException):  # the client leaves while it waits
            httpx.post(
                server.url + "/v1/embeddings",
                json={"model": name, "input": [long, long + " token"]},
                timeout=0.25,
            )
        for thread in busy:
            thread.join(60)
        time.sleep(0.5)
        m = metrics(server)
        assert m['bertattn_dropped_inputs_total{reason="timeout"}'] == 1
        assert m['bertattn_dropped_inputs_total{reason="disconnected"}'] == 2
        assert m["bertattn_batch_texts_sum"] == 10  # neither was computed
        assert m['bertattn_rejections_total{reason="timeout"}'] == 1
        assert httpx.get(server.url + "/live", timeout=10).status_code == 200


def test_timeout_answers_work_that_started(cli_subprocess, tiny_checkpoint, bert):
    """X-Request-Timeout drops work that has not started; work that started is finished and
    answered, never computed for nobody: here one request of 30 inputs spreads over several
    0.2 s batches, far past its 0.1 s deadline once its first batch has started."""
    name = tiny_checkpoint.name
    texts = _texts(7, 30)  # ~12 tokens each, 128 a batch: 3 batches, ~0.6 s
    with running_server(cli_subprocess, tiny_checkpoint, *SMALL, env=DELAY) as server:
        r = _with_deadline(server, {"model": name, "input": texts}, "0.1")
        assert r.status_code == 200, r.text
        rows = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        np.testing.assert_allclose(rows, bert.encode(texts), atol=1e-6, rtol=0)
        m = metrics(server)
        assert m["bertattn_batch_texts_sum"] == 30 and m["bertattn_batch_texts_count"] >= 2
        assert m.get('bertattn_rejections_total{reason="timeout"}', 0) == 0
        assert m["bertattn_queue_tokens"] == 0 and m["bertattn_queue_requests"] == 0


def test_sigterm_drains_without_losing_admitted_requests(cli_subprocess, tiny_checkpoint, bert):
    name = tiny_checkpoint.name
    key = {"Authorization": "Bearer s3cret"}
    args = (*SMALL, "--api-key", "s3cret", "--drain-timeout", "60")
    with running_server(cli_subprocess, tiny_checkpoint, *args, env=DELAY) as server:
        bodies = [{"model": name, "input": _texts(i)} for i in range(16)]  # ~8 batches
        answers: list = []
        burst = threading.Thread(
            target=lambda: answers.extend(asyncio.run(_burst(server.url, bodies, key)))
        )
        burst.start()
        deadline = time.monotonic() + 30
        while metrics(server).get("bertattn_queue_requests", 0) < 4:  # admitted, waiting
            assert time.monotonic() < deadline, "the burst was never queued"
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with httpx.Client(base_url=server.url, timeout=10, headers=key) as c:
            assert c.get("/ready").status_code == 503
            assert c.get("/live").status_code == 200
            late = c.post("/v1/embeddings", json={"model": name, "input": "late"})
            assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
        burst.join(60)
        assert server.wait(60) == 0, server.stderr()[-2000:]
        assert len(answers) == len(bodies)
        for body, r in zip(bodies, answers, strict=True):
            assert r.status_code == 200, r.text  # admitted before SIGTERM: answered
            rows = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
            np.testing.assert_allclose(rows, bert.encode(body["input"]), atol=1e-6, rtol=0)
        assert re.search(r"stopped on SIGTERM: every request in flight answered", server.stderr())


def test_second_sigterm_stops_at_once_and_says_so(cli_subprocess, tiny_checkpoint):
    name = tiny_checkpoint.name
    with running_server(cli_subprocess, tiny_checkpoint, *SMALL, env=DELAY) as server:
        big = {"model": name, "input": _texts(0, 1500)}  # ~30 s of work
        busy = threading.Thread(
            target=lambda: httpx.post(server.url + "/v1/embeddings", json=big, timeout=60),
            daemon=True,
        )
        busy.start()
        wait_queued(server)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(30) == 1, server.stderr()[-2000:]  # work was cut off: not 0
        assert time.monotonic() - t0 < 10  # not the ~30 s the queue would take
        assert "stopped on SIGTERM: drain timed out" in server.stderr()


def test_ctrl_c_exits_130(cli_subprocess, tiny_checkpoint):
    with running_server(cli_subprocess, tiny_checkpoint, "--threads", "1") as server:
        server.proc.send_signal(signal.SIGINT)
        assert server.wait(60) == 130, server.stderr()[-2000:]
        assert "stopped on SIGINT" in server.stderr()
