"""On the CPU a batch of short texts is filled past ``batch_size`` texts
(``BertModel.fill_tokens``): fewer, larger forwards, the rows of batches of exactly
``batch_size`` texts, and never more tokens a forward than ``batch_size`` texts of the
longest length would take."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertattn import Bert

pytestmark = pytest.mark.filterwarnings("ignore:.*were truncated")

#: short texts of 3 to 14 tokens, and three long ones
TEXTS = [f"the head number {i} looks " + "at the token " * (i % 4) for i in range(60)] + [
    "a long passage about attention " * 40,
    "another long passage " * 30,
    "the third long one " * 25,
]


def _forwards(bert: Bert) -> tuple[list[tuple[int, int]], object]:
    """Each forward's ``(B, L)``, recorded by a hook on the encoder (and the hook's handle)."""
    shapes: list[tuple[int, int]] = []

    def hook(module, args, kwargs):  # type: ignore[no-untyped-def]
        ids = args[0] if args else kwargs["input_ids"]
        shapes.append(tuple(ids.shape))

    return shapes, bert.model.register_forward_pre_hook(hook, with_kwargs=True)


def _filled_and_exact(bert: Bert, call):  # type: ignore[no-untyped-def]
    """``call()`` as it runs (filled), then with the fill off (``model.chunk_tokens = 0``):
    ``(filled, its forwards' (B, L), exact, its forwards' (B, L))``."""
    shapes, handle = _forwards(bert)
    try:
        filled = call()
        seen = list(shapes)
        shapes.clear()
        bert.model.chunk_tokens = 0
        exact = call()
    finally:
        handle.remove()
    return filled, seen, exact, shapes


def test_fill_tokens_follows_the_chunk_workers_and_the_memory_bound(tiny_checkpoint) -> None:
    model = Bert.load(tiny_checkpoint, threads=2).model
    model.chunk_tokens = 1024
    torch.set_num_threads(2)  # restored after the test (conftest)
    assert model.fill_tokens(32, 256) == 2 * 2 * 1024  # two chunks per worker
    assert model.fill_tokens(4, 256) == 4 * 256  # never past batch_size full-length texts
    model.chunk_workers = 1  # one worker: two chunks of its own
    assert model.fill_tokens(32, 256) == 2 * 1024
    model.chunk_tokens = 0  # chunks off: batches of batch_size texts, as before
    assert model.fill_tokens(32, 256) == 0


def test_short_texts_fill_fewer_forwards_with_the_same_rows(tiny_checkpoint) -> None:
    bert = Bert.load(tiny_checkpoint, threads=2)
    bert.model.chunk_tokens = 256  # a small budget: the fill stops at 2 x 2 x 256 tokens
    fill = bert.model.fill_tokens(8, bert.max_length)
    filled, seen, exact, shapes = _filled_and_exact(bert, lambda: bert.encode(TEXTS, batch_size=8))
    assert len(shapes) == math.ceil(len(TEXTS) / 8)  # the control: 8 texts a forward
    assert len(seen) < len(shapes)  # the short texts went in fewer forwards
    assert max(b for b, _ in seen) > 8
    for b, length in seen:  # a forward past 8 texts holds at most the fill's tokens
        assert b <= 8 or b * length <= fill, (b, length, fill)
    assert sum(b for b, _ in seen) == len(TEXTS)
    # the same rows: only the float32 rounding of other row counts in the products differs
    np.testing.assert_allclose(filled, exact, rtol=0, atol=2e-6)
    assert np.abs(filled).max() > 0.05


def test_a_reranker_fills_its_batches_too(tiny_checkpoint, tmp_path) -> None:
    from bertattn.heads import CrossEncoder
    from tests.test_heads_cross_encoder import save_classifier

    folder = save_classifier(tiny_checkpoint, tmp_path / "rr", 1, seed=3)
    ce = CrossEncoder(str(folder))
    pairs = [(t, TEXTS[(i + 1) % 60]) for i, t in enumerate(TEXTS[:60])]
    filled, seen, exact, _ = _filled_and_exact(ce.bert, lambda: ce.predict(pairs, batch_size=4))
    assert len(seen) < math.ceil(len(pairs) / 4)
    np.testing.assert_allclose(filled, exact, rtol=0, atol=2e-6)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_long_text_keeps_its_own_batch(tiny_checkpoint, batch_size) -> None:
    bert = Bert.load(tiny_checkpoint, threads=2)
    long = " ".join(["attention"] * 2000)  # truncated to max_length
    shapes, handle = _forwards(bert)
    try:
        bert.encode([long] * batch_size + ["short one"] * 5, batch_size=batch_size)
    finally:
        handle.remove()
    # the long texts fill their batch_size alone: a short text joined to them would pass
    # batch_size texts of max_length tokens; the short ones then share one forward
    assert shapes[0] == (batch_size, bert.max_length)
    assert shapes[1:] == [(5, shapes[1][1])]


def test_multi_vector_documents_fill_their_batches_too(minilm_dir, tmp_path) -> None:
    from bertattn import MultiVectorEncoder
    from tests.test_multi_vector import build

    mve = MultiVectorEncoder(build(minilm_dir, tmp_path / "mve"), threads=2)
    docs = TEXTS[:60]  # cut at the folder's document length, 64 tokens
    filled, seen, exact, _ = _filled_and_exact(
        mve.bert, lambda: mve.encode_document(docs, batch_size=4)
    )
    assert len(seen) < math.ceil(len(docs) / 4)
    for a, b in zip(filled, exact, strict=True):  # one (tokens, 128) array a document
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)


def test_explain_says_how_the_batches_were_filled(tiny_checkpoint, caplog) -> None:
    import logging

    import bertattn

    bert = Bert.load(tiny_checkpoint, threads=2)
    with bertattn.explain() as log, caplog.at_level(logging.DEBUG, logger="bertattn.encoder"):
        bert.encode(TEXTS, batch_size=8)
    said = [n for n in log.notes if n.startswith(f"encode: {len(TEXTS)} texts as ")]
    assert len(said) == 1, log.notes
    assert said[0] in caplog.messages  # the same line at DEBUG: `-vv` on the command line
    fill = bert.model.fill_tokens(8, bert.max_length)
    assert f"(batch_size 8; short texts fill a batch up to {fill} padded tokens" in said[0]
    with bertattn.explain() as log:  # no batch past batch_size: nothing to say
        bert.encode(TEXTS[:8], batch_size=8)
    assert not [n for n in log.notes if "fill a batch" in n]
    bert.model.chunk_tokens = 0  # no fill
    with bertattn.explain() as log:
        bert.encode(TEXTS, batch_size=8)
    assert not [n for n in log.notes if "fill a batch" in n]
