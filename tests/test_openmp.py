"""Giving back a thread's OpenMP workers (``bertattn.runtime.openmp``): the server's main
thread, which loaded the model, frees its pool before the model worker starts, so that the
worker's regions are not slowed by a second pool (the timing is in the module's docstring;
here the mechanism: the threads go away, and the server's start-up calls it)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

from bertattn.runtime.openmp import release_openmp_threads


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_calling_threads_openmp_workers_are_freed():
    before_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(256, 1024)
        torch.nn.functional.gelu(x)  # a parallel region: the pool exists
        with_pool = _threads()
        assert release_openmp_threads() is True  # torch's Linux wheels bundle libgomp
        assert _threads() < with_pool
        torch.nn.functional.gelu(x)  # and the next region makes it again, computing as before
        assert _threads() >= with_pool - 1
    finally:
        torch.set_num_threads(before_threads)


def test_inside_a_parallel_region_or_elsewhere_it_is_harmless():
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(release_openmp_threads()))
    t.start()
    t.join(10)
    assert out in ([True], [False])  # a thread without a pool: nothing to free, no error


def test_the_server_frees_the_loading_threads_pool_before_its_worker_starts(
    tiny_checkpoint, monkeypatch
):
    from starlette.testclient import TestClient

    from bertattn import Bert
    from bertattn.serve import app as app_module
    from bertattn.serve import create_app

    calls: list[bool] = []
    started: list[bool] = []
    monkeypatch.setattr(app_module, "release_openmp_threads", lambda: calls.append(True))
    app = create_app(Bert.load(tiny_checkpoint, threads=1))
    original = app.state.serve.batcher.start

    def start() -> None:
        started.append(bool(calls))  # freed before the worker started
        original()

    monkeypatch.setattr(app.state.serve.batcher, "start", start)
    with TestClient(app) as client:
        assert client.get("/live").status_code == 200
    assert calls == [True] and started == [True]
