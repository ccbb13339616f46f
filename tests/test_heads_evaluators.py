"""sentence-transformers' evaluators run on bertattn's ``SparseEncoder`` and
``MultiVectorEncoder`` (issue 58) and give the metrics they give on sentence-transformers' own
classes over the same folder; the metrics are kept on ``model_card_data``.
(``CrossEncoderRerankingEvaluator`` on ``CrossEncoder``: test_heads_cross_encoder_surface.py.)"""

from __future__ import annotations

import pytest
import torch
from test_multi_vector import build

from bertattn import MultiVectorEncoder, SparseEncoder

QUERIES = {"q1": "where do cats sit?", "q2": "what does attention do?"}
CORPUS = {
    "d1": "the cat sat on the mat",
    "d2": "attention lets every token look at every other token",
    "d3": "a dog runs in the park",
    "d4": "the capital of france is paris",
    "d5": "tokens are weighed by their keys",
}
RELEVANT = {"q1": {"d1"}, "q2": {"d2", "d5"}}


def test_sparse_information_retrieval_evaluator(splade_dir):
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.evaluation import (
        SparseInformationRetrievalEvaluator,
    )

    evaluator = SparseInformationRetrievalEvaluator(
        QUERIES, CORPUS, RELEVANT, name="tiny", show_progress_bar=False, batch_size=2
    )
    ours = SparseEncoder(splade_dir, threads=1)
    got = evaluator(ours)
    want = evaluator(STSparseEncoder(str(splade_dir), device="cpu"))
    assert got.keys() == want.keys() and "tiny_dot_ndcg@10" in got
    assert got == pytest.approx(want, abs=1e-6)
    name, metrics, _, _ = ours.model_card_data.runs[-1]
    assert name == "tiny" and metrics == got


def test_multi_vector_information_retrieval_evaluator(tiny_checkpoint, tmp_path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.evaluation import (
        MultiVectorInformationRetrievalEvaluator,
    )

    folder = build(tiny_checkpoint, tmp_path / "mv", width=16)
    evaluator = MultiVectorInformationRetrievalEvaluator(
        QUERIES, CORPUS, RELEVANT, name="tiny", show_progress_bar=False, batch_size=2
    )
    ours = MultiVectorEncoder(folder, threads=1)
    got = evaluator(ours)
    want = evaluator(STMultiVectorEncoder(str(folder), device="cpu"))
    assert got.keys() == want.keys() and any(k.endswith("ndcg@10") for k in got)
    assert got == pytest.approx(want, abs=1e-6)
    name, metrics, _, _ = ours.model_card_data.runs[-1]
    assert name == "tiny" and metrics == got


SAMPLES = [
    {"query": QUERIES["q1"], "positive": [CORPUS["d1"]], "negative": [CORPUS["d3"], CORPUS["d4"]]},
    {"query": QUERIES["q2"], "positive": [CORPUS["d2"]], "negative": [CORPUS["d3"]]},
]


def _same_as_theirs(evaluator, ours, theirs) -> None:  # type: ignore[no-untyped-def]
    """The evaluator ("rr") gives ours what it gives sentence-transformers' model, and ours
    keeps the run in its model card."""
    got = evaluator(ours)
    want = evaluator(theirs)
    assert got.keys() == want.keys() and got == pytest.approx(want, abs=1e-6)
    assert ours.model_card_data.runs[-1][:2] == ("rr", got)


def test_sparse_reranking_evaluator(splade_dir):
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.evaluation import SparseRerankingEvaluator

    evaluator = SparseRerankingEvaluator(SAMPLES, name="rr", show_progress_bar=False)
    ours = SparseEncoder(splade_dir, threads=1)
    _same_as_theirs(evaluator, ours, STSparseEncoder(str(splade_dir), device="cpu"))


def test_a_list_of_sparse_rows_is_taken_by_similarity(splade_dir):
    ours = SparseEncoder(splade_dir, threads=1)
    rows = ours.encode(list(CORPUS.values()), convert_to_tensor=True)
    listed = ours.encode(list(CORPUS.values()), convert_to_tensor=False)
    assert isinstance(listed, list)
    want = ours.similarity(rows, rows)
    assert torch.equal(ours.similarity(listed, listed), want)
    assert torch.equal(ours.similarity(rows.to_dense().numpy(), rows), want)
    torch.testing.assert_close(ours.similarity_pairwise(listed, listed), want.diagonal())


def test_multi_vector_reranking_evaluator(tiny_checkpoint, tmp_path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.evaluation import (
        MultiVectorRerankingEvaluator,
    )

    folder = build(tiny_checkpoint, tmp_path / "mv", width=16)
    evaluator = MultiVectorRerankingEvaluator(SAMPLES, name="rr", show_progress_bar=False)
    ours = MultiVectorEncoder(folder, threads=1)
    _same_as_theirs(evaluator, ours, STMultiVectorEncoder(str(folder), device="cpu"))
