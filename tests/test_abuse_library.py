"""The library under abuse (items of the issue "Promises under abuse"): a copied or pickled
``Bert``, ``Embeddings`` indexed as NumPy indexes, bounded thread counts, lone surrogates,
and huge texts cut before tokenizing without changing the result."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from pathlib import Path

import numpy as np
import pytest

from bertattn import Bert
from bertattn.threads import ADAPTIVE_ENV


# ---------------------------------------------------------------------- copy and pickle
@pytest.fixture
def governed_bert(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Bert:
    """A tiny Bert loaded as where ``OMP_NUM_THREADS`` is unset: with its thread governor
    (whose lock did not pickle)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(ADAPTIVE_ENV, "1")
    bert = Bert.load(tiny_checkpoint)
    assert bert.governor is not None  # the failing case: a governor with a lock
    return bert


TEXTS = ["hello world", "a second, longer text about attention"]


def test_deepcopy_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = copy.deepcopy(governed_bert)
    assert twin.governor is not governed_bert.governor
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))


def test_pickle_roundtrip_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = pickle.loads(pickle.dumps(governed_bert))
    assert twin.governor is not None
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))
    # the copy's governor still governs: its lock works
    with twin.governor.batch(10) as n:
        assert n >= 1


def _encode_in_worker(blob: bytes) -> np.ndarray:
    return pickle.loads(blob).encode(TEXTS)


@pytest.mark.slow
def test_a_spawned_worker_encodes_with_a_pickled_bert(governed_bert: Bert) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        rows = pool.apply(_encode_in_worker, (pickle.dumps(governed_bert),))
    np.testing.assert_allclose(rows, governed_bert.encode(TEXTS), rtol=0, atol=1e-6)
