"""``bertattn.M3Encoder`` against FlagEmbedding's own ``BGEM3FlagModel`` on the same random-weight
XLM-RoBERTa folder (``colbert_linear`` as wide as the model, as FlagEmbedding builds it): dense,
lexical weights, ColBERT vectors and every ``compute_score`` mode. FlagEmbedding is not in the
dev install (it pulls datasets, peft and accelerate); the formulas test in ``test_m3.py`` always
runs. To run this one: ``pip install --no-deps flagembedding peft accelerate`` and ``datasets``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_m3 import PAIRS, TEXTS, save_m3

from bertattn import M3Encoder

FlagEmbedding = pytest.importorskip(
    "FlagEmbedding", reason="FlagEmbedding is not installed (see this module's docstring)"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_m3(tmp_path_factory.mktemp("m3fe") / "m3", colbert_dim=32)


def test_three_outputs_and_scores_equal_flagembedding(folder):
    fe = FlagEmbedding.BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu")
    ours = M3Encoder(folder)
    flags = dict(return_dense=True, return_sparse=True, return_colbert_vecs=True, batch_size=2)
    want, got = fe.encode(TEXTS, **flags), ours.encode(TEXTS, **flags)
    np.testing.assert_allclose(got["dense_vecs"], want["dense_vecs"], atol=1e-5)
    for g, w in zip(got["lexical_weights"], want["lexical_weights"], strict=True):
        assert list(g) == list(w)
        np.testing.assert_allclose([float(v) for v in g.values()], [float(v) for v in w.values()],
                                   atol=1e-5)  # fmt: skip
    for g, w in zip(got["colbert_vecs"], want["colbert_vecs"], strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
    weights = [0.4, 0.2, 0.4]
    want_s = fe.compute_score(PAIRS, weights_for_different_modes=weights)
    got_s = ours.compute_score(PAIRS, weights_for_different_modes=weights)
    assert set(got_s) == set(want_s)
    for mode in want_s:
        np.testing.assert_allclose(got_s[mode], want_s[mode], atol=1e-4)
