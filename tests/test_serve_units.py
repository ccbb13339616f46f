"""The server's parts in process, fast: the Prometheus formatter, the batcher (token budget,
requests taking turns, shortest first, admission, cancel) on a stand-in model, the limits, and
create_app mounted inside another ASGI app."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertattn.serve.batcher import Batcher, Overloaded, RequestDropped
from bertattn.serve.metrics import Counter, Histogram, Registry
from bertattn.serve.telemetry import ServeMetrics


# ---------------------------------------------------------------------- metrics
def test_prometheus_text():
    r = Registry()
    c = r.add(Counter("x_total", "things", ("route", "status")))
    h = r.add(Histogram("y_seconds", "time", buckets=(0.1, 1)))
    c.inc("/a", "200")
    c.inc("/a", "200", by=2)
    c.inc('we"ird\n', "500")
    h.observe(0.05)
    h.observe(0.5)
    h.observe(5)
    lines = r.render().splitlines()
    assert lines[:2] == ["# HELP x_total things", "# TYPE x_total counter"]
    assert 'x_total{route="/a",status="200"} 3' in lines
    assert 'x_total{route="we\\"ird\\n",status="500"} 1' in lines
    assert "# TYPE y_seconds histogram" in lines
    assert 'y_seconds_bucket{le="0.1"} 1' in lines and 'y_seconds_bucket{le="1"} 2' in lines
    assert 'y_seconds_bucket{le="+Inf"} 3' in lines and "y_seconds_count 3" in lines
    assert "y_seconds_sum 5.55" in lines
    with pytest.raises(ValueError, match="takes labels"):
        c.inc("/a")
    with pytest.raises(ValueError, match="already registered"):
        r.add(Counter("x_total", "again"))


@pytest.mark.parametrize("fast", [True, False], ids=["orjson", "json"])
def test_response_json_keeps_float32_values(monkeypatch, fast):
    import json

    from bertattn.serve import encoding

    if not fast:
        monkeypatch.setattr(encoding, "orjson", None)
    elif encoding.orjson is None:
        pytest.skip("orjson is not installed")
    rows = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    body = encoding.dumps({"data": [{"embedding": r} for r in rows], "n": 3, "s": "é"})
    back = json.loads(body)
    got = np.array([d["embedding"] for d in back["data"]], dtype=np.float32)
    assert np.array_equal(got, rows)  # the same float32 values, to the bit
    assert back["n"] == 3 and back["s"] == "é"


# ---------------------------------------------------------------------- batcher
class FakeBert:
    """Rows ``[tokens, first id]``; each batch recorded; the first batch waits for ``gate``."""

    device = torch.device("cpu")
    governor = None

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()  # the first batch is in the model

    def embed_encodings(self, encodings, normalize=None):  # type: ignore[no-untyped-def]
        self.entered.set()
        if not self.batches:
            self.gate.wait(10)
        self.batches.append([len(e.ids) for e in encodings])
        return torch.tensor([[len(e.ids), e.ids[0]] for e in encodings], dtype=torch.float32)


async def _held(fake: FakeBert) -> None:
    """Until the worker holds its first batch at the gate (so later inputs queue)."""
    for _ in range(1000):
        if fake.entered.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker never took the first batch")


def _enc(n: int, tag: int = 0) -> SimpleNamespace:
    return SimpleNamespace(ids=[tag] * n)


def _submit(b: Batcher, lengths: list[int], tag: int = 0):  # type: ignore[no-untyped-def]
    return b.submit([_enc(n, tag) for n in lengths], lengths)


def _batcher(fake: FakeBert, **kw: object) -> tuple[Batcher, ServeMetrics]:
    holder: dict = {}
    metrics = ServeMetrics(lambda: holder["b"].depth())
    kw = {"max_batch_tokens": 100, "max_queue_tokens": 1000, "max_wait_s": 10, **kw}
    b = holder["b"] = Batcher(fake, metrics=metrics, **kw)  # type: ignore[arg-type]
    return b, metrics


def test_token_budget_shortest_first_and_input_order():
    async def go():
        fake = FakeBert()
        b, _ = _batcher(fake)
        first = _submit(b, [50], tag=9)  # the worker takes it and waits at the gate
        await _held(fake)
        lengths = [40, 5, 30, 5, 60, 20, 10]
        ticket = _submit(b, lengths, tag=1)
        fake.gate.set()
        rows = await asyncio.wait_for(ticket.future, 10)
        await asyncio.wait_for(first.future, 10)
        b.stop(10)
        return fake.batches, rows

    batches, rows = asyncio.run(go())
    assert batches[0] == [50]
    assert all(sum(x) <= 100 for x in batches), batches
    assert batches[1] == [5, 5, 10, 20, 30]  # shortest first, up to the budget
    assert sorted(n for x in batches[1:] for n in x) == sorted([40, 5, 30, 5, 60, 20, 10])
    assert [int(r[0]) for r in rows] == [40, 5, 30, 5, 60, 20, 10]  # in input order


def test_padding_is_capped_too():
    async def go():
        fake = FakeBert()
        b, _ = _batcher(fake)  # 100 real tokens, 200 padded
        _submit(b, [1])  # held at the gate
        await _held(fake)
        ticket = _submit(b, [2] * 30 + [40])  # 100 real tokens, but 31 x 40 = 1240 padded
        fake.gate.set()
        await asyncio.wait_for(ticket.future, 10)
        b.stop(10)
        return fake.batches

    batches = asyncio.run(go())
    assert batches[1] == [2] * 30 and batches[2] == [40], batches
    assert all(len(x) * max(x) <= 200 for x in batches)


def test_aged_input_goes_first():
    async def go():
        fake = FakeBert()
        b, _ = _batcher(fake, max_wait_s=0.05)
        _submit(b, [1])  # held at the gate
        await _held(fake)
        long = _submit(b, [100])
        shorts = [_submit(b, [10]) for _ in range(20)]
        await asyncio.sleep(0.1)  # the long input is now older than max_wait_s
        fake.gate.set()
        await asyncio.wait_for(long.future, 10)
        await asyncio.wait_for(asyncio.gather(*(t.future for t in shorts)), 10)
        b.stop(10)
        return fake.batches

    batches = asyncio.run(go())
    assert batches[1] == [100], batches  # not starved behind 200 tokens of short inputs


def test_a_short_request_waits_for_at_most_one_batch_of_a_large_one():
    """The hostile round's head-of-line blocking: a large request's aged inputs anchored every
    batch and filled it with their neighbours, so a short request waited for all of it. The
    requests take turns: the short one is in the first batch after the one computing."""

    async def go():
        fake = FakeBert()
        b, _ = _batcher(fake, max_wait_s=0.05)
        _submit(b, [1], tag=9)  # held at the gate
        await _held(fake)
        large = _submit(b, [20] * 40, tag=1)  # 800 tokens: 8 batches of 100
        short = _submit(b, [5], tag=2)
        await asyncio.sleep(0.1)  # both older than max_wait_s
        fake.gate.set()
        await asyncio.wait_for(asyncio.gather(large.future, short.future), 10)
        b.stop(10)
        return fake.batches

    batches = asyncio.run(go())
    assert len(batches) == 10, batches  # the held one, 8 of the large request's, the short one
    with_short = [i for i, x in enumerate(batches) if 5 in x]
    assert with_short == [1], batches  # not after the large request's 8 batches


def test_requests_take_turns_batch_after_batch():
    """Two large requests: each batch takes from each in turn, so neither waits for all of the
    other's work (rows tagged by request)."""

    class Tagged(FakeBert):
        def embed_encodings(self, encodings, normalize=None):  # type: ignore[no-untyped-def]
            self.entered.set()
            if not self.batches:
                self.gate.wait(10)
            self.batches.append([e.ids[0] for e in encodings])
            return torch.zeros((len(encodings), 2))

    async def go():
        fake = Tagged()
        b, _ = _batcher(fake)
        _submit(b, [1], tag=9)  # held at the gate
        await _held(fake)
        a = b.submit([_enc(50, 1) for _ in range(4)], [50] * 4)
        c = b.submit([_enc(50, 2) for _ in range(4)], [50] * 4)
        fake.gate.set()
        await asyncio.wait_for(asyncio.gather(a.future, c.future), 10)
        b.stop(10)
        return fake.batches

    assert asyncio.run(go())[1:] == [[1, 2]] * 4  # one of each request in every batch


def test_admission_by_queued_tokens_and_cancel():
    async def go():
        fake = FakeBert()
        b, metrics = _batcher(fake, max_queue_tokens=100)
        _submit(b, [10])  # taken, held at the gate
        await _held(fake)
        kept = _submit(b, [30, 30])
        with pytest.raises(Overloaded) as busy:
            _submit(b, [50])
        assert not busy.value.never and busy.value.retry_after >= 1
        with pytest.raises(Overloaded) as never:
            _submit(b, [101])
        assert never.value.never
        gone = _submit(b, [20, 20])
        assert b.depth() == (2, 100)
        assert b.cancel(gone, "disconnected") == 2
        assert b.depth() == (1, 60)
        fake.gate.set()
        await asyncio.wait_for(kept.future, 10)
        b.stop(10)
        return fake.batches, metrics, gone

    batches, metrics, gone = asyncio.run(go())
    assert sorted(n for x in batches for n in x) == [10, 30, 30]  # the cancelled never ran
    assert metrics.dropped.value("disconnected") == 2
    assert not gone.future.done()


def test_each_batch_runs_under_the_thread_governor():
    from contextlib import contextmanager

    class Governor:
        def __init__(self) -> None:
            self.work: list[int] = []
            self.loops = 0

        @contextmanager
        def batch(self, work: int):  # type: ignore[no-untyped-def]
            self.work.append(work)
            yield 1

        @contextmanager
        def loop(self):  # type: ignore[no-untyped-def]
            self.loops += 1
            yield self

    async def go():
        fake = FakeBert()
        fake.gate.set()
        fake.governor = Governor()  # type: ignore[assignment]
        b, _ = _batcher(fake, max_batch_tokens=10)
        ticket = _submit(b, [4, 4, 4, 3])
        await asyncio.wait_for(ticket.future, 10)
        b.stop(10)
        return fake

    fake = asyncio.run(go())
    assert fake.governor.loops == 1  # one loop for the worker's life
    assert fake.governor.work == [sum(x) for x in fake.batches] and sum(fake.governor.work) == 15


def test_stop_finishes_admitted_work():
    async def go():
        fake = FakeBert()
        fake.gate.set()
        b, _ = _batcher(fake, max_batch_tokens=10)
        tickets = [_submit(b, [5, 5, 5]) for _ in range(5)]
        await asyncio.get_running_loop().run_in_executor(None, b.stop, 10)
        await _held(fake)
        return tickets

    tickets = asyncio.run(go())
    assert all(t.future.done() and len(t.future.result()) == 3 for t in tickets)


# ---------------------------------------------------------------------- limits, create_app
def test_model_names_of_a_folder_and_of_a_hub_name(tmp_path, monkeypatch):
    """What the server and `bertattn serve` both accept as the `model` field."""
    from bertattn.serve.served import model_names

    folder = tmp_path / "my-model"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    assert model_names(str(folder)) == ("my-model", str(folder))
    assert model_names("my-model/") == ("my-model", "my-model/")  # its name without the slash
    org = "sentence-transformers/all-MiniLM-L6-v2"  # no such folder here: a hub name
    assert model_names(org) == (org, "all-MiniLM-L6-v2")
    assert model_names("bert-tiny") == ("bert-tiny",)  # once, not twice


def test_limits_refusals(tiny_checkpoint):
    from bertattn import Bert
    from bertattn.serve import Limits, create_app

    with pytest.raises(ValueError, match="max_queue_tokens"):
        Limits(max_batch_tokens=100, max_queue_tokens=10)
    with pytest.raises(ValueError, match="max_request_inputs"):
        Limits(max_request_inputs=0)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="max_queue_s"):
            Limits(max_queue_s=bad)
    assert Limits(max_queue_s=None).max_queue_s is None
    bert = Bert.load(tiny_checkpoint, threads=1)
    with pytest.raises(ValueError, match="more than the model takes"):
        create_app(bert, max_input_tokens=1000)
    with pytest.raises(TypeError):
        create_app(bert, max_batch_size=3)


def test_create_app_mounted_in_another_app(tiny_checkpoint):
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from bertattn import Bert
    from bertattn.serve import create_app

    bert = Bert.load(tiny_checkpoint, threads=1)
    app = create_app(bert, max_batch_tokens=128)
    outer = Starlette(routes=[Mount("/emb", app=app)])
    texts = ["hello", "the attention head looks at every token"]

    async def go():
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post(
                "/emb/v1/embeddings", json={"model": tiny_checkpoint.name, "input": texts}
            )
            bad = await c.post("/emb/embed", json={"inputs": [1]})
            return r, bad

    try:
        r, bad = asyncio.run(go())
    finally:
        app.state.serve.batcher.stop(10)
    assert r.status_code == 200, r.text
    rows = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    np.testing.assert_allclose(rows, bert.encode(texts), atol=1e-6, rtol=0)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "inputs[0]"


def _raw_post(app, messages: list[dict], path: str = "/v1/embeddings") -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    """One POST straight through the ASGI interface: ``messages`` are what the client sends;
    after them, ``receive`` waits for ever (a client that stalls)."""
    import json

    sent: list[dict] = []
    queue = list(messages)

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()  # never
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def test_a_stalled_or_abandoned_body_is_not_a_hang_nor_a_500(tiny_checkpoint, caplog):
    from bertattn import Bert
    from bertattn.serve import create_app

    bert = Bert.load(tiny_checkpoint, threads=1)
    app = create_app(bert, body_timeout_s=0.2)
    part = {"type": "http.request", "body": b'{"input": "hel', "more_body": True}
    status, body = _raw_post(app, [part])
    assert status == 408 and body["error"]["code"] == "request_timeout", body
    assert "0.2 s" in body["error"]["message"]
    status, body = _raw_post(app, [part, {"type": "http.disconnect"}])
    assert status == 499 and body["error"]["code"] == "client_closed", body
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no traceback logged
    text = app.state.serve.metrics.render()
    assert 'bertattn_rejections_total{reason="request_timeout"} 1' in text
    assert 'bertattn_rejections_total{reason="gone_before_queue"} 1' in text  # not admitted:
    assert "bertattn_admitted_requests_total 0" in text  # told apart from a queued one gone
    assert 'reason="gone"}' not in text


def test_no_truncate_names_the_input_and_its_tokens(tiny_checkpoint):
    import httpx

    from bertattn import Bert
    from bertattn.serve import create_app

    bert = Bert.load(tiny_checkpoint, threads=1)
    app = create_app(bert, truncate=False, max_input_tokens=8)
    texts = ["hello", "the attention head looks at every token in the sentence and weighs it"]

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            body = {"model": tiny_checkpoint.name, "input": texts}
            return await c.post("/v1/embeddings", json=body)

    try:
        r = asyncio.run(go())
    finally:
        app.state.serve.batcher.stop(10)
    n = len(bert.tokenizer.encode_batch(texts[1:], max_length=128)[0].ids)
    assert n > 8
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "input[1]" and error["code"] == "input_too_long"
    assert f"has {n} tokens, more than this server's limit of 8" in error["message"]


class PacedBert(FakeBert):
    """Each batch sleeps ``pace`` seconds per token (so the batcher measures at most 1 / pace
    tokens per second) and waits while ``hold`` is clear."""

    def __init__(self, pace: float) -> None:
        super().__init__()
        self.pace = pace
        self.hold = threading.Event()
        self.hold.set()

    def embed_encodings(self, encodings, normalize=None):  # type: ignore[no-untyped-def]
        import time

        self.entered.set()
        self.hold.wait(10)
        time.sleep(self.pace * sum(len(e.ids) for e in encodings))
        self.batches.append([len(e.ids) for e in encodings])
        return torch.tensor([[len(e.ids), e.ids[0]] for e in encodings], dtype=torch.float32)


@pytest.mark.parametrize(
    "queue_s, floor",
    [(0.5, 0), (None, 0), (0.5, 64), (0.5, 500)],
    ids=["by-time", "tokens-only", "floor-64", "floor-past-the-token-cap"],
)
def test_admission_by_seconds_of_work(queue_s, floor):
    """With ``max_queue_s`` the queue holds that many seconds of work at the measured speed
    (here at most 1000 tokens/s: at most 500 tokens for 0.5 s), far below max_queue_tokens;
    without it only max_queue_tokens counts. ``min_queue_requests``: while fewer requests
    wait, the time cap does not refuse (a burst of small requests gets in); the token cap
    still does."""

    async def go():
        fake = PacedBert(pace=0.001)
        b, _ = _batcher(
            fake, max_queue_tokens=10_000, max_queue_s=queue_s, min_queue_requests=floor
        )
        first = _submit(b, [100] * 4)  # before any batch ran: only the token cap counts
        await asyncio.wait_for(first.future, 10)
        fake.hold.clear()
        fake.entered.clear()
        _submit(b, [50])  # taken, held
        await _held(fake)
        admitted, refused = [], None
        for _ in range(200):
            try:
                admitted.append(_submit(b, [100]))
            except Overloaded as exc:
                refused = exc
                break
        cap = b.queue_cap()
        for t in admitted:
            b.cancel(t, "disconnected")
        fake.hold.set()
        b.stop(10)
        return admitted, refused, cap

    admitted, refused, (cap, by_time) = asyncio.run(go())
    if queue_s is None or floor == 500:  # the token cap: 10,000 tokens waiting
        assert refused is not None and not refused.by_time and len(admitted) == 100
        assert refused.limit == 10_000 and by_time == (queue_s is not None)
    elif floor:  # the floor (the one held is computing, not waiting); then the time cap
        assert refused is not None and refused.by_time and len(admitted) == floor
        assert by_time and cap <= 500 and refused.limit == cap
    else:
        assert refused is not None and refused.by_time and not refused.never
        assert 1 <= len(admitted) <= 5, len(admitted)  # an empty queue takes one; 0.5 s of work
        assert by_time and cap <= 500 and refused.limit == cap
        assert refused.retry_after >= 1


def test_tokenize_small_on_the_loop_large_or_busy_on_the_tokenizer_thread(tiny_checkpoint):
    """Small requests tokenize on the event loop only when the tokenizer is free; a large one,
    or any while the tokenizer is busy, goes to the tokenizer thread, and the loop keeps
    running meanwhile. The tokenizer is never entered by two threads at once."""
    from bertattn import Bert
    from bertattn.serve import create_app

    state = create_app(Bert.load(tiny_checkpoint, threads=1)).state.serve
    where: list[str] = []
    inside = threading.Lock()

    def fn(bert, texts):  # type: ignore[no-untyped-def]
        if not inside.acquire(False):
            raise AssertionError("two threads in the tokenizer at once")
        try:
            where.append(threading.current_thread().name)
            return len(texts)
        finally:
            inside.release()

    async def go():
        main = threading.current_thread().name
        assert await state.tokenize(fn, ["a short query"]) == 1
        assert await state.tokenize(fn, ["x" * 5000]) == 1  # large: off the loop
        state.tokenizer_lock.acquire()  # the tokenizer is busy with another request
        threading.Timer(0.2, state.tokenizer_lock.release).start()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while ticks < 1000:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        assert await state.tokenize(fn, ["short"]) == 1
        ticker.cancel()
        return main, ticks

    main, ticks = asyncio.run(go())
    state.tokenizer_thread.shutdown()
    assert where[0] == main
    assert where[1].startswith("bertattn-tokenize") and where[2].startswith("bertattn-tokenize")
    assert ticks >= 5  # the loop ran while the busy tokenizer was waited for


def test_an_aged_request_past_its_deadline_gives_its_tokens_back():
    """The leak a flood of ``X-Request-Timeout: 1`` found: a request older than ``max_wait_s``
    and past its deadline, taken as the aged anchor of a batch, was dropped without giving its
    tokens back, and an idle server then refused requests (429) until restarted."""

    async def go():
        fake = FakeBert()
        b, metrics = _batcher(fake, max_wait_s=0.05)
        _submit(b, [10])  # taken, held at the gate
        await _held(fake)
        late = b.submit([_enc(20)], [20], deadline=time.monotonic() + 0.02)
        await asyncio.sleep(0.1)  # older than max_wait_s and past its deadline
        fake.gate.set()
        with pytest.raises(RequestDropped):
            await asyncio.wait_for(late.future, 10)
        await asyncio.get_running_loop().run_in_executor(None, b.stop, 10)
        return b, metrics

    b, metrics = asyncio.run(go())
    assert b.depth() == (0, 0)
    assert metrics.dropped.value("timeout") == 1


@pytest.mark.parametrize("rows", [2, 40], ids=["small-on-the-loop", "large-off-the-loop"])
def test_a_large_body_of_token_ids_is_parsed_and_checked_off_the_event_loop(
    tiny_checkpoint, monkeypatch, rows
):
    """The event loop answers /live and every other request: a large body of token ids (40 rows
    of 8,000: 640 KB, 320K ids) is parsed, checked and converted on worker threads, a small one
    (2 rows) on the loop itself (handing it over would cost more than the work). The threads
    each step ran on are recorded, so this holds however fast or loaded the machine is."""
    import dataclasses
    import json

    from bertattn import Bert
    from bertattn.serve import create_app, handling, routes
    from bertattn.serve import embed_routes as app_module

    ran_on: dict[str, int] = {}

    def recorded(name, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kw):  # type: ignore[no-untyped-def]
            ran_on[name] = threading.get_ident()
            return fn(*args, **kw)

        return wrapper

    # the body is parsed where every route reads it (handling), checked and converted in the
    # embedding routes
    for module, name in ((handling, "parse_json"), (app_module, "check_openai"),
                         (app_module, "from_ids")):  # fmt: skip
        monkeypatch.setattr(module, name, recorded(name, getattr(module, name)))
    bert = Bert.load(tiny_checkpoint, threads=1)
    loop_thread: list[int] = []
    original = app_module.embeddings

    async def openai(state, request):  # type: ignore[no-untyped-def]
        loop_thread.append(threading.get_ident())
        return await original(state, request)

    table = [  # the route table holds the handler
        dataclasses.replace(r, handler=openai) if r.handler is original else r
        for r in routes.ROUTES
    ]
    monkeypatch.setattr(routes, "ROUTES", table)
    app = create_app(bert)  # its routes go through the recording endpoint
    ids = [[5] * 8000] * rows
    body = json.dumps({"model": tiny_checkpoint.name, "input": ids}).encode()
    try:
        status, answer = _raw_post(app, [{"type": "http.request", "body": body}])
    finally:
        app.state.serve.batcher.stop(10)
    assert status == 400 and answer["error"]["code"] == "input_too_long", answer  # went through
    assert set(ran_on) == {"parse_json", "check_openai", "from_ids"}, ran_on
    on_loop = {name for name, ident in ran_on.items() if ident == loop_thread[0]}
    assert on_loop == (set(ran_on) if rows == 2 else set()), (rows, on_loop)
