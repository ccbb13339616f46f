"""BertTokenizer in several threads at once: encodes take turns in the order they asked (a
thread that tokenizes without pause cannot keep another waiting), and give what one thread
gets."""

from __future__ import annotations

import pickle
import threading
import time

from bertattn.encoder import BertTokenizer

WORDS = "the quick brown fox jumps over the lazy dog while tokenizers count every piece".split()


def _texts(n: int, seed: int) -> list[str]:
    return [
        " ".join(WORDS[(seed + i * j) % len(WORDS)] for j in range(5 + (i * 7) % 40))
        for i in range(n)
    ]


class _Recorded:
    """Stands in for the wrapped tokenizer: records which thread encodes, and holds the first
    call until released."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.order: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def encode_batch(self, inputs, **kwargs):  # type: ignore[no-untyped-def]
        self.order.append(threading.current_thread().name)
        if len(self.order) == 1:
            self.entered.set()
            assert self.release.wait(30)
        return self.inner.encode_batch(inputs, **kwargs)


def _wait_for_tickets(tok: BertTokenizer, count: int) -> None:
    deadline = time.monotonic() + 30
    while tok._lock._next < count:
        assert time.monotonic() < deadline, "the threads never asked for their turn"
        time.sleep(0.001)


def test_encodes_take_turns_in_the_order_asked(minilm_dir):
    """A thread inside the tokenizer, another waiting, then the first asking again: the
    waiting one goes next (a plain lock may hand it back to the first, again and again)."""
    tok = BertTokenizer.from_folder(minilm_dir)
    rec = _Recorded(tok._tok)
    tok._tok = rec
    texts = _texts(6, 1)
    first = threading.Thread(target=tok.encode_batch, args=(texts,), name="looping")
    first.start()
    assert rec.entered.wait(30)
    other = threading.Thread(target=tok.encode_batch, args=(texts,), name="other")
    other.start()
    _wait_for_tickets(tok, 2)
    again = threading.Thread(target=tok.encode_batch, args=(texts,), name="looping again")
    again.start()
    _wait_for_tickets(tok, 3)
    rec.release.set()
    for t in (first, other, again):
        t.join(30)
    assert rec.order == ["looping", "other", "looping again"]


def test_concurrent_encodes_with_different_lengths_match_one_thread(minilm_dir):
    tok = BertTokenizer.from_folder(minilm_dir)
    jobs = [(_texts(20, seed), length) for seed in range(6) for length in (16, 24, 40, None)]
    serial = BertTokenizer.from_folder(minilm_dir)
    expected = [[e.ids for e in serial.encode_batch(t, max_length=n)] for t, n in jobs]
    got: list[list[list[int]] | None] = [None] * len(jobs)
    start = threading.Barrier(4)

    def work(k: int) -> None:
        start.wait()
        for _ in range(3):
            for i in range(k, len(jobs), 4):
                texts, length = jobs[i]
                got[i] = [e.ids for e in tok.encode_batch(texts, max_length=length)]
                tok.token_ids(texts)  # never truncated, between the truncated ones

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == expected


def test_a_copy_takes_turns_of_its_own(minilm_dir):
    tok = BertTokenizer.from_folder(minilm_dir)
    tok.encode_batch(_texts(3, 2))
    clone = pickle.loads(pickle.dumps(tok))
    assert clone._lock is not tok._lock and clone._lock._next == 0
    texts = _texts(5, 3)
    assert [e.ids for e in clone.encode_batch(texts, max_length=12)] == [
        e.ids for e in tok.encode_batch(texts, max_length=12)
    ]
