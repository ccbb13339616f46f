"""Chunk workers (bertattn.runtime.workers) and the chunk plan they run (bertattn.encoder.chunks):
results in order, at most the workers asked for, their own intra-op count and the caller's
untouched, the caller's context and autograd mode, and the model's chunks run side by side
with the same outputs as transformers."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import torch
import transformers

import bertattn
from bertattn import BertModel
from bertattn.encoder.chunks import balanced_chunks, plan_chunks, regroup_rows, row_costs
from bertattn.runtime import workers


def _covers(ranges, rows):
    """The ranges are consecutive, non-empty and cover all rows in order."""
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(s < e for s, e in ranges)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@pytest.mark.parametrize(
    ("lengths", "pieces", "expected"),
    [
        ([5] * 8, 2, [(0, 4), (4, 8)]),
        ([5] * 8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        ([1, 1, 1, 20], 2, [(0, 3), (3, 4)]),  # the long row alone
        ([20, 1, 1, 1], 3, [(0, 1), (1, 4)]),  # never an empty range
        ([3], 2, [(0, 1)]),
    ],
)
def test_balanced_chunks(lengths, pieces, expected):
    assert balanced_chunks(lengths, pieces) == expected


def test_plan_chunks_budget_workers_and_pieces():
    para = [256] * 32  # 32 paragraphs: 8,192 tokens
    assert plan_chunks(para, 1024, 1) == [(i, i + 4) for i in range(0, 32, 4)]
    assert len(plan_chunks(para, 1024, 3)) == 9  # a multiple of the workers, within the budget
    assert len(plan_chunks(para, 1024, 16)) == 16  # one piece of 512 tokens per worker
    assert len(plan_chunks(para, 1024, 64)) == 32  # no piece under 256 tokens
    short = [20] * 32  # 640 tokens: within the budget, two pieces of >= 256 for two workers
    assert plan_chunks(short, 1024, 1) == [(0, 32)]
    assert plan_chunks(short, 1024, 2) == [(0, 16), (16, 32)]
    assert plan_chunks(short, 1024, 4) == [(0, 16), (16, 32)]  # not 4 pieces of 160
    assert plan_chunks([20] * 8, 1024, 2) == [(0, 8)]  # 160 tokens: not worth a hand-off
    assert plan_chunks(para, 0, 2) == [(0, 32)]  # budget 0: never split
    assert plan_chunks([300], 100, 2) == [(0, 1)]
    assert plan_chunks([], 100, 2) == []
    uneven = [900, 10, 10, 10, 900, 10]
    for w in (1, 2, 3):
        plan = plan_chunks(uneven, 1000, w)
        _covers(plan, len(uneven))
        assert all(e - s == 1 or sum(uneven[s:e]) <= 1000 for s, e in plan)


def test_row_costs_grow_with_the_square_of_the_length():
    # MiniLM's widths: 2E + I = 2,304; a row of 256 tokens costs 256 * (1 + 512 / 2,304)
    assert row_costs([1, 256], 384, 1536) == pytest.approx([1 + 2 / 2304, 256 * (1 + 512 / 2304)])
    costs = row_costs([10, 20, 40], 32, 37)
    assert costs[1] > 2 * costs[0] and costs[2] > 2 * costs[1]


def test_regroup_rows_evens_out_a_batch_sorted_shortest_first():
    lengths = [10] * 12 + [150] * 4  # a server's batch: shortest first
    costs = row_costs(lengths, 384, 1536)
    plan = plan_chunks(lengths, 1024, 2)
    assert plan == [(0, 14), (14, 16)]  # contiguous: 420 tokens against 300
    order, ranges = regroup_rows(lengths, costs, plan, 1024)
    assert sorted(order) == list(range(len(lengths)))
    _covers(ranges, len(lengths))
    assert len(ranges) == len(plan)
    pieces = [[order[i] for i in range(s, e)] for s, e in ranges]
    assert all(p == sorted(p) for p in pieces)  # each piece keeps the batch's own order
    loads = [sum(costs[i] for i in p) for p in pieces]
    assert max(loads) - min(loads) <= max(costs[:12])  # within one short row
    assert [sum(lengths[i] for i in p) for p in pieces] == [360, 360]
    assert max(loads) < 0.98 * max(sum(costs[s:e]) for s, e in plan)


def test_regroup_rows_only_where_it_pays_and_within_the_budget():
    even = [5] * 8
    assert regroup_rows(even, row_costs(even, 32, 37), [(0, 4), (4, 8)], 100) is None
    one = [10, 150]
    assert regroup_rows(one, row_costs(one, 32, 37), [(0, 2)], 1000) is None
    lengths = [10] * 12 + [150] * 4
    costs = row_costs(lengths, 384, 1536)
    plan = plan_chunks(lengths, 1024, 2)
    assert regroup_rows(lengths, costs, plan, 1024) is not None
    assert regroup_rows(lengths, costs, plan, 350) is None  # a piece would hold 360 tokens


def test_run_all_keeps_order_and_raises_the_first_error():
    def slow(i):
        def f():
            time.sleep(0.002 * (7 - i))  # the last ones finish first
            return i

        return f

    assert workers.run_all([slow(i) for i in range(8)], 2) == list(range(8))
    ran = []

    def failing(i):
        def f():
            ran.append(i)
            if i in (3, 5):
                raise KeyError(i)
            return i

        return f

    with pytest.raises(KeyError, match="3"):
        workers.run_all([failing(i) for i in range(8)], 2)
    assert sorted(ran) == list(range(8))  # every one ran before the error was raised
    with pytest.raises(ValueError, match="threads_each"):
        workers.run_all([slow(0), slow(1)], 2, threads_each=0)


def test_run_all_at_most_the_workers_asked_for():
    workers.run_all([lambda: time.sleep(0.01)] * 3, 3)  # the pool now has 3 threads
    lock, now, most, names = threading.Lock(), [0], [0], set()

    def f():
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            names.add(threading.current_thread().name)
        time.sleep(0.01)
        with lock:
            now[0] -= 1

    workers.run_all([f] * 8, 2)
    assert most[0] == 2
    assert threading.current_thread().name not in names


def test_workers_thread_counts_and_the_callers_untouched(monkeypatch):
    monkeypatch.setattr(workers, "_pools", {})  # a pool made by this test
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        counts = workers.run_all([torch.get_num_threads] * 4, 2, threads_each=1)
        assert counts == [1] * 4
        assert torch.get_num_threads() == 3
        seen = []  # a thread started afterwards gets the process's count, not the workers'
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == [3]
    finally:
        torch.set_num_threads(before)


def test_run_all_carries_context_and_autograd_mode():
    def state():
        return (
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            workers.in_worker(),
        )

    with torch.no_grad():
        assert workers.run_all([state] * 2, 2) == [(False, False, True)] * 2
    with torch.inference_mode():
        assert workers.run_all([state] * 2, 2) == [(False, True, True)] * 2
    assert workers.run_all([state] * 2, 2) == [(True, False, True)] * 2

    def nested():  # from a worker: serial, in that worker's own thread
        me = threading.current_thread()
        return workers.run_all([threading.current_thread] * 3, 2) == [me] * 3

    assert workers.run_all([nested] * 2, 2) == [True, True]
    with bertattn.explain() as log:
        workers.run_all([lambda: bertattn.attention.dispatch.note("from a worker")] * 2, 2)
    assert log.notes == ["from a worker"] * 2


def test_an_interrupted_wait_starts_nothing_more_and_lets_running_ones_end():
    """Ctrl-C or a signal handler's exception while the caller waits: no further callable
    starts, and the exception goes on only once the running ones have ended (a worker torn
    down inside a kernel at exit aborts the process)."""
    import signal

    started, ended = [], []

    def slow(i):
        def f():
            started.append(i)
            time.sleep(0.3)
            ended.append(i)

        return f

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(Stop):
            workers.run_all([slow(i) for i in range(8)], 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(started) == sorted(ended) == [0, 1]


def _child(q):
    q.put(workers.run_all([lambda: threading.current_thread().name] * 2, 2))


def test_pool_rebuilt_after_fork():
    workers.run_all([lambda: 0] * 2, 2)  # a pool in the parent
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    names = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert all(n.startswith("bertattn-chunks-") for n in names)


class _Threads:
    """The threads BertModel._run ran on, one name per chunk."""

    def __init__(self, model: BertModel) -> None:
        self.names: list[str] = []
        run = model._run

        def spied(*args, **kwargs):
            self.names.append(threading.current_thread().name)
            return run(*args, **kwargs)

        model._run = spied  # type: ignore[method-assign]


def _batch(rows: int = 9, length: int = 14):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 99, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for i in range(0, rows, 2):
        mask[i, length - 1 - i % length :] = 0
    mask[:, 0] = 1
    return ids * mask, mask


def _same_outputs(out, ref, mask) -> None:
    """Our outputs and transformers' agree at the real tokens (last and every hidden state)
    and for the pooler."""
    real = mask.bool()
    torch.testing.assert_close(
        out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["auto", "varlen", "math"])
def test_chunks_side_by_side_match_transformers(tiny_checkpoint, backend):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        hf = transformers.BertModel.from_pretrained(tiny_checkpoint).eval()
        model = BertModel.from_pretrained(tiny_checkpoint, backend=backend).eval()
        model.chunk_tokens = 20
        spy = _Threads(model)
        ids, mask = _batch()
        with torch.inference_mode():
            ref = hf(ids, mask, output_hidden_states=True)
            out = model(ids, mask, output_hidden_states=True)
        assert len(spy.names) > 2
        assert all(n.startswith("bertattn-chunks-") for n in spy.names)
        with torch.inference_mode(), bertattn.explain() as log:
            model(ids, mask)
        said = [n for n in log.notes if n.startswith("row chunks:")]
        assert len(said) == 1 and "on 2 chunk workers, 1 thread each" in said[0], log.notes
        _same_outputs(out, ref, mask)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("backend", ["auto", "math"])
def test_regrouped_chunks_match_transformers_row_for_row(tiny_checkpoint, backend):
    """A batch sorted shortest first (a server's): the rows are regrouped into even pieces for
    the two workers and every output, per-layer tuples included, comes back in the batch's
    own row order."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        hf = transformers.BertModel.from_pretrained(
            tiny_checkpoint, attn_implementation="eager"
        ).eval()
        model = BertModel.from_pretrained(tiny_checkpoint, backend=backend).eval()
        model.chunk_tokens = 1000  # one budget: two pieces, one per worker
        lengths = [8] * 10 + [120] * 4  # contiguous: 320 tokens against 240
        g = torch.Generator().manual_seed(3)
        ids = torch.randint(5, 99, (len(lengths), 120), generator=g)
        mask = torch.zeros_like(ids)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        ids = ids * mask
        want = backend == "math"  # the weights too: per-layer tuples put back in order
        with torch.inference_mode(), bertattn.explain() as log:
            out = model(ids, mask, output_hidden_states=True, output_attentions=want)
        with torch.inference_mode():
            ref = hf(ids, mask, output_hidden_states=True, output_attentions=want)
        said = [n for n in log.notes if n.startswith("row chunks:")]
        assert len(said) == 1 and "regrouped by cost" in said[0], log.notes
        _same_outputs(out, ref, mask)
        if want:
            for ours, theirs in zip(out.attentions, ref.attentions, strict=True):
                torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    finally:
        torch.set_num_threads(before)


def test_chunks_in_the_callers_thread_where_they_must_be(tiny_checkpoint):
    """chunk_workers=1, one intra-op thread, autocast, and recording the article's steps: every
    chunk in the calling thread; and chunk_workers is checked and kept by copies."""
    import copy
    import pickle

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = BertModel.from_pretrained(tiny_checkpoint, backend="math").eval()
        model.chunk_tokens = 20
        ids, mask = _batch()
        me = threading.current_thread().name
        spy = _Threads(model)
        with torch.inference_mode():
            model(ids, mask)
        assert set(spy.names) == {"bertattn-chunks-1"}
        for setting in ("workers", "threads", "autocast", "steps"):
            spy.names.clear()
            model.chunk_workers = 1 if setting == "workers" else None
            torch.set_num_threads(1 if setting == "threads" else 2)
            with torch.inference_mode():
                if setting == "autocast":
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        model(ids, mask)
                elif setting == "steps":
                    with bertattn.attention.steps.record_steps():
                        model(ids, mask)
                else:
                    model(ids, mask)
            assert len(spy.names) > 2 and set(spy.names) == {me}, setting
    finally:
        torch.set_num_threads(before)
    for bad, kind in ((0, ValueError), ("2", TypeError), (1.0, TypeError)):
        with pytest.raises(kind, match="chunk_workers"):
            model.chunk_workers = bad
    del model._run  # the spy
    model.chunk_workers = 3
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.chunk_workers == 3


def test_balanced_batches_and_the_governor_leaves_them_at_full_count(tiny_checkpoint):
    """``model.balances_load``: more chunks than workers; the engine runs such a batch at the
    governor's top count, unjudged, and governs the others (one piece per worker included)."""
    from bertattn.engine import embedding_step
    from bertattn.runtime.threads import ThreadGovernor

    bert = bertattn.Bert.load(tiny_checkpoint)
    model = bert.model
    model.chunk_tokens = 100
    assert model.balances_load(300, 2) and model.balances_load(20000, 4)
    assert not model.balances_load(200, 2)  # two chunks, one per worker: no slack
    assert not model.balances_load(300, 3) and not model.balances_load(300, 1)
    model.chunk_workers = 1
    assert not model.balances_load(300, 2)
    model.chunk_workers, model.chunk_tokens = None, 0
    assert not model.balances_load(300, 2)
    model.chunk_tokens = 100
    bert.governor = ThreadGovernor(2)
    step = embedding_step(bert)
    long = bert.tokenizer.encode_batch([" ".join(["word"] * 40)] * 16)  # 16 x 42 tokens
    short = bert.tokenizer.encode_batch(["a few words"] * 4)
    before = torch.get_num_threads()
    try:
        with step.session():
            step(long, sum(len(e.ids) for e in long))
            step(short, sum(len(e.ids) for e in short))
    finally:
        torch.set_num_threads(before)
    assert bert.governor.stats.balanced == 1 and bert.governor.stats.batches == 1
