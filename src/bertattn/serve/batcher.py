"""One model worker thread, fed by a token-budget queue.

Each admitted input waits as an item with its real token count. The worker forms a batch of at
most ``max_batch_tokens`` real tokens (and at most twice that once padded) by taking turns
between the waiting requests, round robin: each request in turn gives its shortest waiting input,
round after round until nothing more fits, and the requests that gave go to the back of the line.
So a short request waits for at most the batch being computed and one more, however large the
requests ahead of it (a request of 512 long texts no longer holds every later one behind all of
its work), and no request is starved. A request larger than one batch is spread over several and
answered when its last row is in, rows in input order.

The event loop only admits (:meth:`Batcher.submit`, a lock and a few additions) and awaits a
future; the worker resolves it with ``loop.call_soon_threadsafe``, exactly once, or drops the
request's remaining items when it is cancelled (client gone) or its deadline passed before any
of its work started (work that started is finished and answered, never computed for nobody).

The queue's counts are right by construction: :meth:`Batcher.submit` is the one place that adds
an item's tokens and :meth:`Batcher._retire` the one place that takes them off, once per item
(its ``taken`` flag), whether the item leaves in a batch, by a cancel, a deadline, a stop or a
dead worker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .telemetry import ServeMetrics

logger = logging.getLogger("bertattn.serve")

__all__ = ["Batcher", "Overloaded", "RequestDropped", "Ticket"]


class Overloaded(Exception):
    """The queue cannot take the request now (``retry_after`` seconds: when the queue, at the
    measured speed, will have room for it), or ever (``never``: the request alone holds more
    than ``max_queue_tokens``). ``limit``: the cap that refused it now, in tokens; ``by_time``:
    that cap was ``max_queue_s`` of work at the measured speed, not ``max_queue_tokens``."""

    def __init__(
        self, tokens: int, queued: int, limit: int, retry_after: int, *, never: bool = False,
        by_time: bool = False,
    ) -> None:  # fmt: skip
        self.tokens, self.queued, self.limit, self.retry_after = tokens, queued, limit, retry_after
        self.never, self.by_time = never, by_time
        super().__init__(f"{tokens} tokens with {queued} queued exceeds {limit}")


class RequestDropped(Exception):
    """The request's work was dropped before it ran: ``reason`` ``"timeout"`` or
    ``"disconnected"`` or ``"stopped"``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(eq=False)
class Ticket:
    """One request's work. ``rows[i]``: input i's ``(E,)`` float32 row once computed."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    deadline: float | None
    enqueued: float = field(default_factory=time.monotonic)
    rows: list[np.ndarray | None] = field(default_factory=list)
    remaining: int = 0  # rows not yet computed
    waiting: int = 0  # items not yet in a batch
    started: float | None = None  # when its first item went into a batch
    inference_s: float = 0.0
    finished: bool = False  # resolved (rows, or an error): never twice
    items: list[_Item] = field(default_factory=list)  # its inputs, in input order
    pending: deque[_Item] = field(default_factory=deque)  # its items to batch, shortest first


@dataclass(eq=False)
class _Item:
    ticket: Ticket
    index: int
    encoding: Any
    tokens: int
    enqueued: float
    taken: bool = False  # retired: in a batch, or dropped (its tokens are off the count)


def _resolve(future: asyncio.Future, value: object) -> None:
    if future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


class Batcher:
    """The queue and the one model worker of a server (see the module docstring).

    ``step``: a :class:`bertattn.engine.ModelStep` (the worker holds its ``session()`` and
    calls it on each batch with the batch's real tokens), or a :class:`bertattn.Bert`, taken
    as its :func:`bertattn.engine.embedding_step`."""

    def __init__(
        self,
        step: Any,
        *,
        max_batch_tokens: int,
        max_queue_tokens: int,
        max_wait_s: float = 0.5,
        max_queue_s: float | None = None,
        min_queue_requests: int = 0,
        metrics: ServeMetrics | None = None,
    ) -> None:
        from ..engine import ModelStep, embedding_step

        self.step: ModelStep = step if isinstance(step, ModelStep) else embedding_step(step)
        self.max_batch_tokens = max_batch_tokens
        self.max_queue_tokens = max_queue_tokens
        #: seconds of queued work (at the measured tokens/s) before new requests get 429, so
        #: an admitted request's wait stays bounded whatever the model's speed; None: tokens only
        self.max_queue_s = max_queue_s
        #: while fewer requests than this wait, a new one is admitted whatever the time cap
        #: says (never past ``max_queue_tokens``): a burst of small requests gets in although
        #: the speed measured on tiny batches (or a cold first one) makes the time cap small
        self.min_queue_requests = min_queue_requests
        self.max_wait_s = max_wait_s  # the idle worker looks at the queue this often
        #: padded tokens (inputs x the longest) a batch may reach: short inputs batched with a
        #: long one would otherwise pad to thousands of times their length
        self.max_padded = 2 * max_batch_tokens
        self.metrics = metrics
        self._cond = threading.Condition()
        self._line: deque[Ticket] = deque()  # requests with items to batch, whose turn first
        self._queued_tokens = 0
        self._queued_tickets: set[Ticket] = set()
        self._running = 0  # items in the batch being computed
        self._batch: list[_Item] = []  # that batch (its requests are failed if the worker dies)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._speed = 0.0  # tokens per second, a moving average
        self.failed: BaseException | None = None  # the worker died of this

    # ---------------------------------------------------------------- state
    def queue_cap(self) -> tuple[int, bool]:
        """``(tokens, by_time)``: how many tokens may wait now. ``max_queue_tokens``, or
        ``max_queue_s`` of work at the measured speed when that is less (once a batch has been
        timed). An empty queue takes any request up to ``max_queue_tokens`` whatever this
        says (:meth:`submit`), so a large request is never refused for good."""
        cap = self.max_queue_tokens
        if self.max_queue_s is not None and self._speed > 0:
            by_time = max(1, int(self._speed * self.max_queue_s))
            if by_time < cap:
                return by_time, True
        return cap, False

    def depth(self) -> tuple[int, int]:
        """``(requests, tokens)`` admitted and not yet computed."""
        with self._cond:
            return len(self._queued_tickets), self._queued_tokens

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def idle(self) -> bool:
        with self._cond:
            return not self._queued_tickets and self._running == 0

    def start(self) -> None:
        """Start the worker (once; :meth:`submit` starts it too)."""
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._work, name="bertattn-model", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Let the worker finish every admitted item, then end; True when it ended in time.
        Items still queued after ``timeout`` are answered ``RequestDropped("stopped")``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            with self._cond:
                for ticket in list(self._queued_tickets):
                    self._drop(ticket, "stopped")
            return False
        return True

    # ---------------------------------------------------------------- the event loop's side
    def submit(
        self, encodings: Sequence[Any], tokens: Sequence[int], *, deadline: float | None = None
    ) -> Ticket:
        """Admit one request's inputs (``tokens[i]`` real tokens each) or raise
        :class:`Overloaded`; call from the event loop (the ticket's future belongs to it).
        ``deadline``: a ``time.monotonic()`` after which items not yet started are dropped."""
        if len(encodings) != len(tokens) or not encodings:
            raise ValueError(f"{len(encodings)} encodings for {len(tokens)} token counts.")
        loop = asyncio.get_running_loop()
        total = int(sum(tokens))
        ticket = Ticket(loop, loop.create_future(), deadline)
        ticket.rows = [None] * len(encodings)
        ticket.remaining = ticket.waiting = len(encodings)
        with self._cond:
            if self._stopping:
                raise RequestDropped("stopped")
            queued = self._queued_tokens
            if total > self.max_queue_tokens:
                raise Overloaded(total, queued, self.max_queue_tokens, 0, never=True)
            cap, by_time = self.queue_cap()
            if by_time and len(self._queued_tickets) < self.min_queue_requests:
                cap, by_time = self.max_queue_tokens, False  # the floor: the token cap only
            if queued and queued + total > cap:  # an empty queue takes any request it can hold
                wait = self._retry_after(queued + total - cap)
                raise Overloaded(total, queued, cap, wait, by_time=by_time)
            now = ticket.enqueued
            for i, (enc, n) in enumerate(zip(encodings, tokens, strict=True)):
                item = _Item(ticket, i, enc, int(n), now)
                ticket.items.append(item)
            ticket.pending.extend(sorted(ticket.items, key=lambda it: it.tokens))
            self._line.append(ticket)
            self._queued_tokens += total  # the one place that adds (see _retire)
            self._queued_tickets.add(ticket)
            if self.metrics is not None:
                self.metrics.admitted_requests.inc()
                self.metrics.admitted_inputs.inc(by=len(encodings))
            self._cond.notify()
        if self._thread is None:
            self.start()
        return ticket

    def cancel(self, ticket: Ticket, reason: str) -> int:
        """Drop the ticket's items not yet in a batch (``reason``: ``"disconnected"``,
        ``"timeout"``); the number dropped. Its future is left alone (the caller stopped
        waiting) and is never resolved."""
        with self._cond:
            ticket.finished = True
            return self._drop(ticket, reason)

    def expire(self, ticket: Ticket) -> bool:
        """The ticket's deadline passed: drop it (True, its future resolved with
        ``RequestDropped("timeout")``) when none of its work has started; False when some
        has, and then all of it is computed and answered (work that started is never thrown
        away). Atomic with the worker taking items, so no request is both."""
        with self._cond:
            if ticket.finished or ticket.started is not None:
                return False
            self._drop(ticket, "timeout")
            return True

    def _retry_after(self, excess: int) -> int:
        """Whole seconds until ``excess`` queued tokens are computed (at least 1)."""
        speed = self._speed or 1000.0
        return max(1, math.ceil(excess / speed))

    def _drop(self, ticket: Ticket, reason: str, error: BaseException | None = None) -> int:
        """(lock held) Take the ticket's untaken items out; resolve it with ``error`` (default
        ``RequestDropped(reason)``)."""
        dropped = 0
        for item in ticket.items:
            if not item.taken:
                self._retire(item)
                dropped += 1
        if dropped and self.metrics is not None:
            self.metrics.dropped.inc(reason, by=dropped)
        if not ticket.finished:
            ticket.finished = True
            self._call(ticket, RequestDropped(reason) if error is None else error)
        return dropped

    def _retire(self, item: _Item) -> None:
        """(lock held) The one place an item leaves the queue's counts, once: into a batch or
        dropped, by whatever path."""
        if item.taken:
            return
        item.taken = True
        self._queued_tokens -= item.tokens
        ticket = item.ticket
        ticket.waiting -= 1
        if ticket.waiting == 0:
            self._queued_tickets.discard(ticket)

    @staticmethod
    def _call(ticket: Ticket, value: object) -> None:
        try:
            ticket.loop.call_soon_threadsafe(_resolve, ticket.future, value)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    # ---------------------------------------------------------------- the worker's side
    def _take(self) -> list[_Item]:
        """(lock held) The next batch: items out of the queue, at most max_batch_tokens, the
        waiting requests taking turns (see the module docstring)."""
        now = time.monotonic()
        batch: list[_Item] = []
        gave: dict[Ticket, None] = {}  # the requests with an item in the batch, in turn order
        real = longest = 0
        active = list(self._line)
        while active:  # one round: each request in turn gives its shortest input that fits
            still = []
            for ticket in active:
                item = self._next(ticket)
                if item is None:
                    continue
                if batch and not self._fits(item.tokens, real, len(batch), longest):
                    continue  # its shortest does not fit: nor will its others, in this batch
                ticket.pending.popleft()
                if self._accept(item, now):
                    batch.append(item)
                    real, longest = real + item.tokens, max(longest, item.tokens)
                    gave[ticket] = None
                still.append(ticket)
            active = still
        self._rotate(list(gave))
        for item in batch:
            ticket = item.ticket
            if ticket.started is None:
                ticket.started = now
                if self.metrics is not None:
                    self.metrics.stage.observe(now - ticket.enqueued, "queue")
        self._running = len(batch)
        self._batch = batch
        return batch

    @staticmethod
    def _next(ticket: Ticket) -> _Item | None:
        """(lock held) The ticket's shortest item still to batch (dropped ones skipped)."""
        pending = ticket.pending
        while pending and pending[0].taken:
            pending.popleft()
        return pending[0] if pending else None

    def _rotate(self, gave: list[Ticket]) -> None:
        """(lock held) The requests that gave to this batch go to the back of the line, in
        their order; those with nothing left to batch leave it."""
        given = set(gave)
        kept = [t for t in self._line if t not in given and self._next(t) is not None]
        self._line = deque([*kept, *(t for t in gave if self._next(t) is not None)])

    def _fits(self, k: int, real: int, size: int, longest: int) -> bool:
        """An input of ``k`` tokens joins a batch of ``size`` inputs, ``real`` tokens, the
        longest ``longest``: real tokens within ``max_batch_tokens``, padded tokens within
        ``max_padded``. Once false for ``k`` it stays false while the batch fills and for any
        longer input (the batch only grows)."""
        padded = (size + 1) * max(longest, k)
        return real + k <= self.max_batch_tokens and padded <= self.max_padded

    def _accept(self, item: _Item, now: float) -> bool:
        """(lock held) Whether ``item`` goes into the batch: not taken or dropped, its request
        not past its deadline before any of it started (then the request is dropped)."""
        if item.taken:
            return False
        ticket = item.ticket
        if ticket.deadline is not None and now > ticket.deadline and ticket.started is None:
            self._drop(ticket, "timeout")  # retires this item too (it is one of the ticket's)
            return False
        self._retire(item)
        return True

    def _work(self) -> None:
        try:
            with self.step.session():
                while True:
                    with self._cond:
                        batch = self._take()
                        while not batch:
                            if self._stopping and not self._queued_tickets:
                                return
                            self._cond.wait(timeout=self.max_wait_s or None)
                            batch = self._take()
                    self._run(batch)
        except BaseException as exc:  # the worker is gone: fail what waits, say so
            self.failed = exc
            logger.exception("the model worker stopped")
            with self._cond:
                running = [item.ticket for item in self._batch]
                for ticket in dict.fromkeys([*running, *self._queued_tickets]):
                    self._drop(ticket, "stopped")
                self._batch, self._running = [], 0

    def _run(self, batch: list[_Item]) -> None:
        tokens = sum(item.tokens for item in batch)
        start = time.perf_counter()
        try:
            rows = self.step([item.encoding for item in batch], tokens)  # (B, ...) float32
            error: BaseException | None = None
        except Exception as exc:  # a failed batch fails its requests, not the server
            logger.exception("a model batch of %d inputs failed", len(batch))
            rows, error = None, exc
        elapsed = time.perf_counter() - start
        if elapsed > 0:
            speed = tokens / elapsed
            self._speed = speed if not self._speed else 0.8 * self._speed + 0.2 * speed
        if self.metrics is not None:
            self.metrics.batch_texts.observe(len(batch))
            self.metrics.batch_tokens.observe(tokens)
            self.metrics.batch_seconds.observe(elapsed)
            self.metrics.tokens.inc(by=tokens)
        with self._cond:
            self._running = 0
            self._batch = []
            seen: set[int] = set()
            for j, item in enumerate(batch):
                ticket = item.ticket
                if ticket.finished:
                    continue  # dropped while it ran (its deadline, or the client left)
                if rows is None:
                    self._drop(ticket, "failed", error)
                    continue
                ticket.rows[item.index] = rows[j]
                if id(ticket) not in seen:
                    seen.add(id(ticket))
                    ticket.inference_s += elapsed
                ticket.remaining -= 1
                if ticket.remaining == 0:
                    ticket.finished = True
                    if self.metrics is not None:
                        self.metrics.stage.observe(ticket.inference_s, "inference")
                    self._call(ticket, ticket.rows)
            self._cond.notify_all()
