"""The server's queue under random sequences of what clients and the process do: submit,
cancel (a client gone), a passed deadline (``expire`` and the worker's own check), a failing
model batch, stop with and without time to finish. Whatever the path each request leaves by,
the counts return to zero, every input is computed at most once, and every request someone
still waits for is answered exactly once (its own rows, or the reason it was dropped).

The regression this guards: an aged request past its deadline was dropped without giving its
tokens back, so an idle server refused requests with 429 until it was restarted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertattn.serve.batcher import Batcher, Overloaded, RequestDropped
from bertattn.serve.telemetry import ServeMetrics


class ModelFailed(Exception):
    """What the stand-in model raises for the batches told to fail."""


class StandIn:
    """A model whose rows are ``[input uid, tokens]``; it records each uid it computes and
    fails the batches whose number is in ``fail``."""

    device = torch.device("cpu")
    governor = None

    def __init__(self, fail: set[int], pace: float) -> None:
        self.fail = fail
        self.pace = pace
        self.computed: list[int] = []
        self.failed: list[int] = []  # uids of the inputs in failed batches
        self.batches = 0
        self.lock = threading.Lock()

    def embed_encodings(self, encodings, normalize=None):  # type: ignore[no-untyped-def]
        with self.lock:
            number = self.batches
            self.batches += 1
        if self.pace:
            time.sleep(self.pace)
        if number in self.fail:
            self.failed.extend(e.uid for e in encodings)
            raise ModelFailed(f"batch {number}")
        self.computed.extend(e.uid for e in encodings)
        return torch.tensor([[e.uid, len(e.ids)] for e in encodings], dtype=torch.float32)


class Counting(Batcher):
    """A batcher that counts how often each request's future is resolved."""

    answers: dict[int, int]

    def _call(self, ticket, value):  # type: ignore[no-untyped-def,override]
        self.answers[id(ticket)] = self.answers.get(id(ticket), 0) + 1
        Batcher._call(ticket, value)


submit = st.tuples(
    st.just("submit"),
    st.lists(st.integers(1, 40), min_size=1, max_size=6),  # tokens of each input
    st.one_of(st.none(), st.floats(-0.01, 0.03)),  # deadline, seconds from now
)
cancel = st.tuples(st.just("cancel"), st.integers(0, 50))
expire = st.tuples(st.just("expire"), st.integers(0, 50))
pause = st.tuples(st.just("sleep"), st.floats(0, 0.01))
step = st.one_of(submit, submit, cancel, expire, pause)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    steps=st.lists(step, max_size=25),
    fail=st.sets(st.integers(0, 6), max_size=2),
    max_wait=st.sampled_from([0.0, 0.005, 0.05]),
    pace=st.sampled_from([0.0, 0.002]),
    stop_after=st.sampled_from([10.0, 0.0]),  # time to finish, or none: what waits is dropped
)
def test_counts_return_to_zero_and_each_request_is_answered_once(
    steps, fail, max_wait, pace, stop_after
):
    model = StandIn(fail, pace)

    async def go():  # type: ignore[no-untyped-def]
        holder: dict = {}
        metrics = ServeMetrics(lambda: holder["b"].depth())
        b = holder["b"] = Counting(
            model, max_batch_tokens=60, max_queue_tokens=150, max_wait_s=max_wait, metrics=metrics
        )
        b.answers = {}
        tickets, inputs, given_up = [], {}, set()
        uid = 0
        for op in steps:
            if op[0] == "submit":
                _, lengths, offset = op
                encodings = []
                for n in lengths:
                    encodings.append(SimpleNamespace(ids=[0] * n, uid=uid))
                    uid += 1
                deadline = None if offset is None else time.monotonic() + offset
                try:
                    ticket = b.submit(encodings, lengths, deadline=deadline)
                except Overloaded:
                    continue
                tickets.append(ticket)
                inputs[id(ticket)] = [e.uid for e in encodings]
            elif op[0] == "cancel" and tickets:
                ticket = tickets[op[1] % len(tickets)]
                b.cancel(ticket, "disconnected")
                given_up.add(id(ticket))
            elif op[0] == "expire" and tickets:
                b.expire(tickets[op[1] % len(tickets)])
            elif op[0] == "sleep":
                await asyncio.sleep(op[1])
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, b.stop, stop_after)
        assert await loop.run_in_executor(None, b.stop, 10)  # the worker has ended
        for _ in range(5):  # the worker's answers reach the loop through call_soon_threadsafe
            await asyncio.sleep(0.01)
        return b, metrics, tickets, inputs, given_up

    b, metrics, tickets, inputs, given_up = asyncio.run(go())
    assert b.depth() == (0, 0)
    assert b.idle()
    computed = model.computed
    assert len(computed) == len(set(computed)), "an input was computed twice"
    reasons = ("timeout", "disconnected", "stopped", "failed")
    dropped = sum(metrics.dropped.value(r) for r in reasons)
    admitted = sum(len(v) for v in inputs.values())
    # each admitted input left the queue exactly once: computed, failed in its batch, or dropped
    assert len(computed) + len(model.failed) + dropped == admitted
    assert metrics.admitted_inputs.value() == admitted
    assert metrics.admitted_requests.value() == len(tickets)
    for ticket in tickets:
        assert b.answers.get(id(ticket), 0) <= 1, "a request was answered twice"
        if id(ticket) in given_up:  # the caller stopped waiting: answered or not, left alone
            continue
        assert b.answers.get(id(ticket)) == 1 and ticket.future.done(), "never answered"
        error = ticket.future.exception()
        if error is None:
            rows = ticket.future.result()
            assert [int(r[0]) for r in rows] == inputs[id(ticket)]  # its own rows, in order
        else:
            assert isinstance(error, (RequestDropped, ModelFailed)), error
    if stop_after:  # time to finish: only deadlines, cancels and failures drop work
        assert metrics.dropped.value("stopped") == 0


def test_expire_drops_only_work_that_has_not_started():
    gate = threading.Event()

    class Held(StandIn):
        def embed_encodings(self, encodings, normalize=None):  # type: ignore[no-untyped-def]
            gate.wait(10)
            return super().embed_encodings(encodings)

    model = Held(set(), 0.0)

    async def go():  # type: ignore[no-untyped-def]
        b = Batcher(model, max_batch_tokens=10, max_queue_tokens=100, max_wait_s=10)
        running = b.submit([SimpleNamespace(ids=[0] * 6, uid=0)] * 1, [6])
        for _ in range(500):
            if b.depth() == (0, 0):
                break
            await asyncio.sleep(0.01)
        waiting = b.submit([SimpleNamespace(ids=[0] * 6, uid=1)], [6])
        assert b.expire(running) is False  # in the model: it will be answered
        assert b.expire(waiting) is True
        assert b.depth() == (0, 0)
        gate.set()
        rows = await asyncio.wait_for(running.future, 10)
        with pytest.raises(RequestDropped):
            await asyncio.wait_for(waiting.future, 10)
        await asyncio.get_running_loop().run_in_executor(None, b.stop, 10)
        return rows

    rows = asyncio.run(go())
    assert int(rows[0][0]) == 0 and model.computed == [0]
