"""Chunk workers: a large CPU batch's row chunks computed side by side, each on its share of
the intra-op threads.

PyTorch's CPU kernels split every operation across the OpenMP pool and wait at a barrier, so
each product runs at the pace of its slowest thread. When something else holds a core (a
thread of the same process tokenizing, as a server's request threads do, or another process),
the thread that shares that core finishes its half late and every product waits for it.
Independent row chunks need no barrier between them: ``w`` workers, each computing whole
chunks with ``n // w`` intra-op threads, take the next chunk from one queue, so a worker on a
shared core simply does fewer of them. Measured on a 2-core Xeon (MiniLM float32, 40
paragraphs, texts/s): alone 33.8 at two intra-op threads vs 35.0 with two chunk workers;
beside a thread tokenizing without pause 12.6 vs 26.1; beside another process tokenizing
6.3 vs 26.4 (OpenVINO f32, whose thread pool balances its work dynamically: 32.0, 22.5, 23.1).

The pool's threads live for the process (daemon threads, rebuilt after a ``fork``); each sets
its own intra-op count once, and the caller's count is restored right after, so the count the
user or the thread policy chose is unchanged. A forward called from a worker runs its chunks
itself (no waiting on the pool from inside it).
"""

from __future__ import annotations

import contextvars
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from .threads import CHUNK_WORKER_PREFIX

__all__ = ["in_worker", "run_all"]

T = TypeVar("T")

_local = threading.local()
_lock = threading.Lock()
#: intra-op threads per worker -> that pool's task queue and its threads
_pools: dict[int, tuple[queue.SimpleQueue, list[threading.Thread]]] = {}


def in_worker() -> bool:
    """True on a chunk worker's thread (a nested forward there runs its chunks serially)."""
    return getattr(_local, "worker", False)


def _loop(tasks: queue.SimpleQueue, threads_each: int, ready: threading.Event) -> None:
    _local.worker = True
    torch.get_num_threads()  # torch's per-thread set-up first, so it cannot undo the next line
    torch.set_num_threads(threads_each)
    ready.set()
    while True:  # daemon threads: they end with the process
        tasks.get()()


class _Call:
    """One :func:`run_all`: its callables, taken in order by at most ``workers`` runners."""

    def __init__(self, fns: Sequence[Callable[[], Any]]) -> None:
        self.fns = fns
        self.results: list[tuple[bool, Any] | None] = [None] * len(fns)
        self.next = 0
        self.lock = threading.Lock()
        self.ended = threading.Condition(self.lock)
        self.runners_done = 0  # a count, not a token: an interruption cannot lose one

    def cancel(self) -> None:
        """No runner starts another callable (those running finish theirs)."""
        with self.lock:
            self.next = len(self.fns)

    def __call__(self) -> None:  # one runner, on a pool thread
        while True:
            with self.lock:
                i = self.next
                self.next += 1
            if i >= len(self.fns):
                break
            try:
                self.results[i] = (True, self.fns[i]())
            except BaseException as exc:  # handed to the caller, which raises it
                self.results[i] = (False, exc)
        with self.lock:
            self.runners_done += 1
            self.ended.notify_all()

    def wait(self, runners: int) -> None:
        """Until ``runners`` runners have ended."""
        with self.lock:
            while self.runners_done < runners:
                self.ended.wait()


def _pool(workers: int, threads_each: int) -> queue.SimpleQueue:
    """The queue of a pool with at least ``workers`` threads of ``threads_each`` each."""
    with _lock:
        tasks, threads = _pools.setdefault(threads_each, (queue.SimpleQueue(), []))
        if len(threads) < workers:
            caller = torch.get_num_threads()
            for _ in range(workers - len(threads)):
                ready = threading.Event()
                t = threading.Thread(
                    target=_loop,
                    args=(tasks, threads_each, ready),
                    name=f"{CHUNK_WORKER_PREFIX}{threads_each}",
                    daemon=True,
                )
                t.start()
                ready.wait()
                threads.append(t)
            torch.set_num_threads(caller)  # the workers' set-up changed torch's process default
        return tasks


def run_all(fns: Sequence[Callable[[], T]], workers: int, threads_each: int = 1) -> list[T]:
    """``[fn() for fn in fns]``, computed by ``workers`` pool threads of ``threads_each``
    intra-op threads each, taking the next callable as they finish (so a worker on a busy core
    does fewer); at most ``workers`` at a time for this call, however large the pool. Each runs
    in a copy of the caller's context and in its autograd / inference mode. Results in the
    order of ``fns``; the first exception (in that order) is raised after all have finished.
    Interrupted while waiting (``KeyboardInterrupt``, a signal handler's exception), no further
    callable starts and the interruption is raised once the running ones have ended. Serial, in
    the calling thread, for ``workers < 2`` or from inside a worker."""
    if workers < 2 or len(fns) < 2 or in_worker():
        return [fn() for fn in fns]
    if threads_each < 1:
        raise ValueError(f"threads_each must be at least 1, got {threads_each}.")
    workers = min(workers, len(fns))
    tasks = _pool(workers, threads_each)
    call = _Call([_as_caller(fn) for fn in fns])
    for _ in range(workers):
        tasks.put(call)
    try:
        call.wait(workers)
    except BaseException:  # the caller interrupted (Ctrl-C, a signal's handler): stop handing
        call.cancel()  # out chunks and let the running ones end before the exception goes on,
        call.wait(workers)  # so no worker is inside a kernel when the process exits (a thread
        raise  # torn down there aborts the whole process)
    for ok, value in call.results:  # type: ignore[misc]
        if not ok:
            raise value
    return [value for _, value in call.results]  # type: ignore[misc]


def _as_caller(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` to run on another thread as it would here: in a copy of this thread's context
    (an :func:`bertattn.explain` block open here records there too) and its autograd mode."""
    ctx = contextvars.copy_context()
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def run() -> T:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return ctx.run(fn)

    return run


def _forget_after_fork() -> None:  # a forked child has none of the parent's threads
    global _lock
    _pools.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
