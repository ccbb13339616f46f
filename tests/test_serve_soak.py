"""A soak of a real ``bertattn serve``: mixed traffic for a while — ordinary requests, floods
over the queue's cap, tight ``X-Request-Timeout`` deadlines, clients that leave mid-request —
then the promises are checked: the queue is empty in requests and tokens, every admitted request
was answered once and every admitted input computed or dropped once (by the server's own
counters), every 200 holds the right rows, the process's memory is back within 10% of where it
stood after warm-up, and a request as large as a batch is still taken (the symptom of a leaked
queue was an idle server answering 429 to it forever).

Traffic goes to 127.0.0.1 only, bounded in time (``BERTATTN_SOAK_SECONDS``: 20 by default, in
the slow tier of ``make test``, 600 in ``make soak``) and in concurrency; the fast tier runs the
same soak in-process for a few seconds. 20 s still holds every kind of traffic many times over
(about 8 floods of 32, one every ~2 s, and 4 steady clients sending plain requests, tight
deadlines and clients that leave: hundreds of requests) and the checks below require each to
have happened (200s, 429s, clients gone); the warm-up before the memory is read is at least
4 s (two floods) whatever the length. The ten-minute run of ``make soak`` is the one that finds
slow leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import numpy as np
import psutil
import pytest
from serve_server import free_port, running_server

POOL = [
    "the cat sat on the mat",
    "attention is all you need",
    "a head looks at the previous token",
    "queues must give their tokens back",
    " ".join(["long"] * 60),
    "short",
    "the animal didn't cross the street because it was too tired",
    "multi head self attention from theory to practice",
]
LIMITS = ("--max-batch-tokens", "256", "--max-queue-tokens", "2048", "--threads", "1")
SLOW_MODEL = {"BERTATTN_TEST_BATCH_DELAY": "0.01"}  # each batch 10 ms slower: floods queue


@dataclass
class Tally:
    """What the clients saw."""

    status: Counter = field(default_factory=Counter)
    left: int = 0  # requests whose client went away before the answer
    wrong: list[str] = field(default_factory=list)


def _rows(response: httpx.Response) -> np.ndarray:
    return np.array([d["embedding"] for d in response.json()["data"]], np.float32)


async def _one(client: httpx.AsyncClient, tally: Tally, oracle: dict, kind: str, rng) -> None:
    """One request of ``kind`` (plain, deadline, leave) of 1-6 texts from the pool."""
    texts = rng.choices(POOL, k=rng.randint(1, 6))
    headers, timeout = {}, 60.0
    if kind == "deadline":
        headers["X-Request-Timeout"] = f"{rng.uniform(0.005, 0.2):.3f}"
    elif kind == "leave":
        timeout = rng.uniform(0.001, 0.05)
    try:
        r = await client.post(
            "/v1/embeddings",
            json={"model": oracle["model"], "input": texts},
            headers=headers,
            timeout=timeout,
        )
    except httpx.TimeoutException:
        if kind != "leave":
            tally.wrong.append(f"a {kind} request timed out on the client")
        tally.left += 1
        return
    tally.status[r.status_code] += 1
    if r.status_code == 200:
        want = np.stack([oracle[t] for t in texts])
        if not np.allclose(_rows(r), want, atol=1e-5, rtol=0):
            tally.wrong.append(f"rows differ for {texts}")
    elif r.status_code not in (429, 504) or (r.status_code == 504 and kind != "deadline"):
        tally.wrong.append(f"{kind}: {r.status_code} {r.text[:200]}")


async def _traffic(url: str, seconds: float, oracle: dict, seed: int) -> Tally:
    """``seconds`` of mixed traffic: 4 steady clients, and every ~2 s one flood of 32."""
    tally = Tally()
    stop = time.monotonic() + seconds
    kinds = ["plain"] * 6 + ["deadline"] * 2 + ["leave"] * 2
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=url, limits=limits) as client:

        async def steady(i: int) -> None:
            rng = random.Random(seed * 100 + i)
            while time.monotonic() < stop:
                await _one(client, tally, oracle, rng.choice(kinds), rng)

        async def floods() -> None:
            rng = random.Random(seed)
            while time.monotonic() < stop:
                await asyncio.gather(
                    *(_one(client, tally, oracle, rng.choice(kinds), rng) for _ in range(32))
                )
                await asyncio.sleep(min(2.0, max(0.0, stop - time.monotonic())))

        await asyncio.gather(floods(), *(steady(i) for i in range(4)))
    return tally


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


_ANSWERED = 'bertattn_requests_total{{route="embeddings",status="{}"}}'
#: 499s of clients that left before their request reached the queue (never admitted)
_GONE_BEFORE = 'bertattn_rejections_total{reason="gone_before_queue"}'


def _closed(m: dict[str, float]) -> float:
    """Admitted requests answered: 200, dropped (504) or gone from the queue (the 499s less
    those of clients that left before their request was admitted)."""
    done = sum(m.get(_ANSWERED.format(s), 0) for s in (200, 499, 504))
    return done - m.get(_GONE_BEFORE, 0)


def _unanswered(m: dict[str, float]) -> float:
    """Requests admitted and not yet answered (see :func:`_closed`)."""
    return m.get("bertattn_admitted_requests_total", 0) - _closed(m)


def _settled(url: str, timeout: float = 30) -> dict[str, float]:
    """/metrics once the queue is empty and every admitted request is counted answered (a
    client that left is counted 499 when its work ends, after the queue emptied); bounded: a
    server that never settles is returned as it is, and the checks then fail on it."""
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(url)
        empty = m["bertattn_queue_requests"] == 0 and m["bertattn_queue_tokens"] == 0
        if (empty and _unanswered(m) == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def _check(url: str, tally: Tally, before: dict[str, float], oracle: dict) -> None:
    """The promises after a soak (``before``: /metrics when the soak began)."""
    m = _settled(url)  # waits for the answers to clients that left to be counted

    def grew(key: str) -> float:
        return m.get(key, 0) - before.get(key, 0)

    assert not tally.wrong, tally.wrong[:5]
    assert tally.status[200] > 0 and tally.status[429] > 0 and tally.left > 0, tally
    assert m["bertattn_queue_requests"] == 0 and m["bertattn_queue_tokens"] == 0
    answered = {s: grew(_ANSWERED.format(s)) for s in (200, 429, 499, 504)}
    # what the clients saw, plus what those that left were answered (499 or other), if their
    # request reached the app at all before they left
    seen = sum(tally.status.values())
    assert seen <= sum(answered.values()) <= seen + tally.left, (answered, tally)
    for status in (429, 504):
        assert tally.status[status] <= answered[status] <= tally.status[status] + tally.left
    assert tally.status[200] <= answered[200] <= tally.status[200] + tally.left
    # admitted requests are answered once: 200, or dropped (504 deadline, 499 gone); a client
    # that left while its body was read got a 499 too, and was never admitted
    assert grew("bertattn_admitted_requests_total") == _closed(m) - _closed(before)
    assert grew(_GONE_BEFORE) <= answered[499]
    dropped = sum(
        grew(f'bertattn_dropped_inputs_total{{reason="{r}"}}')
        for r in ("timeout", "disconnected", "stopped", "failed")
    )
    assert grew("bertattn_admitted_inputs_total") == grew("bertattn_batch_texts_sum") + dropped
    big = {"model": oracle["model"], "input": [" ".join(["token"] * 254)] * 8}  # 8 inputs cut at
    # the model's max length: a batch's worth (an idle server with a leaked count refused it)
    r = httpx.post(url + "/v1/embeddings", json=big, timeout=60)
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def oracle(tiny_checkpoint) -> dict[str, np.ndarray]:
    from bertattn import Bert

    bert = Bert.load(tiny_checkpoint, threads=1)
    return {**dict(zip(POOL, bert.encode(POOL), strict=True)), "model": tiny_checkpoint.name}


@pytest.mark.slow
def test_soak_real_server(cli_subprocess, tiny_checkpoint, oracle):
    seconds = float(os.environ.get("BERTATTN_SOAK_SECONDS", "20"))
    warm_up = min(10.0, max(4.0, seconds / 10))  # two floods at least: pools at their size
    with running_server(cli_subprocess, tiny_checkpoint, *LIMITS, env=SLOW_MODEL) as server:
        proc = psutil.Process(server.proc.pid)
        asyncio.run(_traffic(server.url, warm_up, oracle, seed=1))
        _settled(server.url)
        rss = proc.memory_info().rss
        before = _metrics(server.url)
        tally = asyncio.run(_traffic(server.url, seconds, oracle, seed=2))
        _check(server.url, tally, before, oracle)
        after = proc.memory_info().rss
        assert after <= 1.10 * rss, f"RSS {rss / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB"


@pytest.mark.filterwarnings("ignore:.*were truncated")  # the last, large request is cut
def test_soak_in_process(tiny_checkpoint, oracle):
    """The same soak, short, on the app served by uvicorn in this process (the fast tier)."""
    import uvicorn

    from bertattn import Bert
    from bertattn.jobs.serve import slowed
    from bertattn.serve import create_app

    bert = Bert.load(tiny_checkpoint, threads=1)
    app = create_app(bert, max_batch_tokens=256, max_queue_tokens=2048)
    batcher = app.state.serve.batcher
    batcher.step = slowed(batcher.step, 0.01)  # each batch 10 ms slower, as SLOW_MODEL
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        before = _metrics(url)
        tally = asyncio.run(_traffic(url, 4.0, oracle, seed=3))
        _check(url, tally, before, oracle)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            thread.join(30)
