"""Late chunking's cost is linear in the text (the hostile round's 2.9 GB for a 500 KB text came
from ``(windows, tokens)`` and ``(spans, tokens)`` tables): the window each token is read from,
the tokens of each span and the pooling are checked against plain per-token and per-span
oracles written here, and their peak memory is measured at two sizes (tracemalloc sees NumPy's
allocations): doubling the text about doubles it. Pooling many spans is one gather and one
segment reduction per group of spans, in groups of bounded size, and a server does it off its
event loop."""

from __future__ import annotations

import re
import threading
import tracemalloc

import numpy as np
import pytest
import torch

from bertattn.encoder import late_chunks
from bertattn.encoder.late_chunks import (
    TokenWindows,
    best_window,
    first_characters,
    plan_windows,
    pool_spans,
    span_members,
)


def _peak(fn, *args) -> int:  # type: ignore[no-untyped-def]
    """Bytes allocated at the peak of ``fn(*args)`` (NumPy's allocations included)."""
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _best_by_hand(starts: list[int], width: int, n: int) -> list[int]:
    """Per token: the window with the most context on both sides, the earlier on a tie."""
    out = []
    for p in range(n):
        best, pick = -1, -1
        for w, s in enumerate(starts):
            if s <= p < s + width and min(p - s, s + width - 1 - p) > best:
                best, pick = min(p - s, s + width - 1 - p), w
        out.append(pick)
    return out


@pytest.mark.parametrize(("n", "width", "overlap"), [(300, 64, 32), (301, 50, 49), (40, 64, 0)])
def test_best_window_is_the_rule_token_by_token(n, width, overlap):
    starts = plan_windows(n, width, overlap)
    width = min(width, n)
    assert best_window(starts, width, n).tolist() == _best_by_hand(starts, width, n)


def test_best_window_memory_is_linear_in_the_text():
    def run(n: int) -> None:
        best_window(plan_windows(n, 64, 32), 64, n)

    small, large = _peak(run, 20_000), _peak(run, 40_000)
    # the (windows, tokens) table took 625 x 20,000 x 8 bytes (x4 when doubled); now O(n)
    assert large < 2.5 * small, (small, large)
    assert small < 40 * 20_000, small  # a few int64 arrays of the tokens, no table


def test_gather_reads_each_window_once_and_keeps_none(monkeypatch):
    """The token states from a stream of windows: each token's row from the window the rule
    names (by hand here), and no more than the window at hand and the one before alive (a
    (windows, length, width) stack cost twice the windows' memory)."""
    import gc
    import weakref

    from bertattn.encoder.late_chunks import WindowPlan, gather_states

    n, width, head = 300, 64, 1
    starts = plan_windows(n, width, 32)
    length = head + width + 1
    plan = WindowPlan(np.zeros((len(starts), length)), np.zeros((len(starts), length)), head,
                      width, n, np.zeros((n, 2), dtype=np.int64), starts)  # fmt: skip
    rng = np.random.default_rng(0)
    made = [rng.standard_normal((length, 4)).astype(np.float32) for _ in starts]
    alive: list[weakref.ref] = []
    most = 0

    def stream():  # type: ignore[no-untyped-def]
        nonlocal most
        for window in made:
            gc.collect()
            most = max(most, sum(r() is not None for r in alive))
            fresh = torch.from_numpy(window.copy())
            alive.append(weakref.ref(fresh))
            yield fresh
            del fresh

    got = gather_states(plan, stream()).states
    pick = _best_by_hand(starts, width, n)
    want = np.stack([made[w][head + p - starts[w]] for p, w in enumerate(pick)])
    assert np.array_equal(got.numpy(), want)
    assert most <= 1, most  # the one before is let go before the next is made


def _text_and_offsets(words: int) -> tuple[str, np.ndarray]:
    """``words`` words of 3 to 7 letters, one space apart (some lines break); one token a
    word with its leading space, as SentencePiece's ``▁word``."""
    rng = np.random.default_rng(words)
    lengths = rng.integers(3, 8, words)
    parts, offsets, at = [], [], 0
    for i, k in enumerate(lengths.tolist()):
        sep = "\n" if i % 13 == 12 else " "
        parts.append(sep + "x" * k)
        offsets.append((at, at + 1 + k))
        at += 1 + k
    return "".join(parts), np.array(offsets, dtype=np.int64)


def test_first_characters_skip_the_leading_space():
    text = " ab\u3000\u2003 cd  "
    offsets = np.array([[0, 3], [3, 8], [8, 10]])
    assert first_characters(text, offsets).tolist() == [1, 6, 10]  # the last: all space


def _spans(text: str, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, len(text))) for a in range(0, len(text), size)]


def test_span_members_are_the_tokens_whose_word_starts_in_the_span():
    text, offsets = _text_and_offsets(400)
    spans = [*_spans(text, 37), (0, len(text)), (100, 900)]
    spans.sort()
    order, bounds = span_members(text, offsets, spans)
    first = first_characters(text, offsets)
    for (a, b), (lo, hi) in zip(spans, bounds.tolist(), strict=True):
        want = [i for i in range(len(offsets)) if a <= first[i] < b]
        assert sorted(order[lo:hi].tolist()) == want, (a, b)


def test_span_members_memory_is_linear_in_the_text_and_spans():
    def run(words: int) -> None:
        text, offsets = _text_and_offsets(words)
        span_members(text, offsets, _spans(text, 40))

    small, large = _peak(run, 20_000), _peak(run, 40_000)
    # the (spans, tokens) table: 3,000 x 20,000 bools, 4 times that when doubled
    assert large < 2.5 * small, (small, large)


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_pooling_many_spans_equals_each_span_pooled_by_hand(monkeypatch, pooling):
    text, offsets = _text_and_offsets(3000)
    first = first_characters(text, offsets)
    spans = sorted([*_spans(text, 11), (0, len(text)), (500, 4000), (500, 600)])
    spans = [(a, b) for a, b in spans if ((first >= a) & (first < b)).any()]  # the tail's may not
    states = torch.from_numpy(np.random.default_rng(1).standard_normal((3000, 8), np.float32))
    tokens = TokenWindows(states, offsets, [0])
    want = []
    for a, b in spans:
        keep = torch.from_numpy((first >= a) & (first < b))
        rows = states[keep]
        want.append(rows.mean(0) if pooling == "mean" else rows.amax(0))
    groups: list[int] = []
    original = late_chunks._pool_group

    def counted(states, order, bounds, out, how):  # type: ignore[no-untyped-def]
        groups.append(len(bounds))
        return original(states, order, bounds, out, how)

    monkeypatch.setattr(late_chunks, "_pool_group", counted)
    monkeypatch.setattr(late_chunks, "_POOL_CELLS", 8 * 600)  # 600 (span, token) cells a group
    got = pool_spans(text, tokens, spans, pooling=pooling, normalize=False, truncate_dim=None)
    np.testing.assert_allclose(got.numpy(), torch.stack(want).numpy(), atol=1e-5, rtol=0)
    assert sum(groups) == len(spans)
    assert 1 < len(groups) < len(spans) / 20, groups  # bounded groups, not one call a span


def test_the_server_pools_late_chunks_off_its_event_loop(tiny_checkpoint, monkeypatch):
    """``/embed_late_chunks`` with max pooling: the spans are pooled on a worker thread (the
    hostile round's 2,048 spans blocked /live for 20-30 s when pooled on the loop); the rows
    equal the library's."""
    import json

    from test_serve_units import _raw_post

    from bertattn import Bert
    from bertattn.serve import create_app

    ran_on: list[int] = []
    original = late_chunks.pool_windows

    def recorded(*args, **kw):  # type: ignore[no-untyped-def]
        ran_on.append(threading.get_ident())
        return original(*args, **kw)

    monkeypatch.setattr(late_chunks, "pool_windows", recorded)
    bert = Bert.load(tiny_checkpoint, threads=1)
    text = "the attention head looks at the token before it " * 8
    spans = [[m.start(), m.end()] for m in re.finditer(r"\S+", text)]  # a span a word
    body = {"text": text, "spans": spans, "pooling": "max", "normalize": False}
    app = create_app(bert)
    try:
        status, answer = _raw_post(
            app, [{"type": "http.request", "body": json.dumps(body).encode()}], "/embed_late_chunks"
        )
    finally:
        app.state.serve.batcher.stop(10)
    assert status == 200, answer
    want = bert.encode_late_chunks(text, spans, pooling="max", normalize=False)
    np.testing.assert_allclose(np.array(answer, dtype=np.float32), want, atol=1e-5, rtol=0)
    assert ran_on and ran_on[0] != threading.get_ident(), "pooled on the event loop's thread"
