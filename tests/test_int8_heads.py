"""``dtype="int8"`` under the multi-vector heads: ``MultiVectorEncoder`` and ``M3Encoder`` run
their encoder's products in int8, and what they return keeps what their own float32 path
(:func:`bertattn.encoder.int8.float32_path`, the same model) returns on the load check's texts
(``CALIBRATION``: six topics of eleven sentences), measured by benchmarks.multi_vector's
``colbert_fidelity`` and ``m3_fidelity`` (the numbers the benchmark prints with ``--dtype int8``).

The folders: the default model's real encoder (all-MiniLM-L6-v2) under a seeded projection (a
ColBERT saved by sentence-transformers) or beside seeded bge-m3 linear layers.

The bars, and where they come from: every cosine (each token row, bge-m3's dense vectors) is held
to the load check's bars for sentence embeddings (``MIN_COSINE`` the lowest, ``MEAN_COSINE`` the
mean); every ranking (each text's 10 best texts by MaxSim or by dense vector, its 10 heaviest
lexical tokens) to the check's neighbour bar ``NEIGHBOURS_KEPT``, as a mean over the texts. The
check asks it of each text; here that would measure ties: with seeded, not trained, projections a
text's 10 best by MaxSim are its own topic's only two times in three in float32, so its 10th and
11th score nearly the same (measured: one text of 66 keeps 8 of its 10, the two it loses scored
within 0.05 of those that replace them, while int8 moves a score by up to 0.28 of about 3).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

from benchmarks.multi_vector import (
    add_m3_linears,
    colbert_fidelity,
    lexical_kept,
    m3_fidelity,
    token_cosines,
    top_kept,
)
from bertattn import M3Encoder, MultiVectorEncoder
from bertattn.encoder.int8 import CALIBRATION, MEAN_COSINE, MIN_COSINE, NEIGHBOURS_KEPT, is_int8

TEXTS = list(CALIBRATION)


# ------------------------------------------------------------------ the measures, by hand
def test_token_cosines_are_each_rows_cosine() -> None:
    reference = [torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[3.0, 4.0]])]
    rows = [torch.tensor([[1.0, 1.0], [0.0, 1.0]]), torch.tensor([[-3.0, -4.0]])]
    got = token_cosines(reference, rows)
    assert torch.allclose(got, torch.tensor([0.5**0.5, 1.0, -1.0], dtype=torch.float64))


def test_token_cosines_refuse_rows_of_other_tokens() -> None:
    with pytest.raises(ValueError, match=r"text 0: reference rows \(2, 3\) and rows \(1, 3\)"):
        token_cosines([torch.ones(2, 3)], [torch.ones(1, 3)])


def test_top_kept_counts_each_rows_best_columns() -> None:
    reference = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    scores = torch.tensor([[4.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    assert top_kept(reference, scores, k=2).tolist() == [0.5, 1.0]
    assert top_kept(reference, scores, k=3).tolist() == [2 / 3, 1.0]
    # without its own column, row 0's best two are columns 1, 2 against 3, 2
    assert top_kept(reference, scores, k=2, skip_self=True).tolist() == [0.5, 1.0]


def test_lexical_kept_counts_each_texts_heaviest_tokens() -> None:
    reference = [{"7": 3.0, "8": 2.0, "9": 1.0}, {"5": 1.0}, {}]
    weights = [{"7": 3.0, "9": 2.5, "8": 0.5}, {"5": 0.2, "6": 0.9}, {"1": 1.0}]
    assert lexical_kept(reference, weights, k=2).tolist() == [0.5, 0.0, 1.0]


# ------------------------------------------------------------------ int8 under the heads
@pytest.fixture(scope="module")
def int8_here() -> None:
    """Skips where int8 is refused on this CPU (as test_int8.py's tests are skipped)."""
    from test_int8 import REFUSED

    if REFUSED is not None:
        pytest.skip(REFUSED)


@pytest.fixture(scope="module")
def colbert(int8_here, minilm_dir, tmp_path_factory) -> MultiVectorEncoder:
    from test_multi_vector import build

    folder = build(minilm_dir, tmp_path_factory.mktemp("int8-colbert") / "colbert")
    return MultiVectorEncoder(folder, dtype="int8")  # the threads int8 was timed at


@pytest.fixture(scope="module")
def m3_folder(minilm_dir, tmp_path_factory) -> Path:
    """The encoder's files alone (a plain Hugging Face folder, no modules.json) and seeded
    ``colbert_linear.pt`` (384 -> 384) and ``sparse_linear.pt``."""
    out = tmp_path_factory.mktemp("int8-m3") / "m3"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json"):  # fmt: skip
        shutil.copy(minilm_dir / name, out / name)
    return add_m3_linears(out, 384)


@pytest.mark.slow  # quantizes and verifies the encoder, compiles the int8 kernels
def test_multi_vector_token_rows_and_maxsim_keep_float32s(colbert) -> None:
    assert is_int8(colbert.bert.model)
    got = colbert_fidelity(colbert, TEXTS, TEXTS, skip_self=True)
    assert got["token_cosine_mean"] < 1 - 1e-5, got  # int8 ran: its rows are not float32's
    assert got["token_cosine_min"] >= MIN_COSINE, got
    assert got["token_cosine_mean"] >= MEAN_COSINE, got
    assert got["kept_mean"] >= NEIGHBOURS_KEPT, got


@pytest.mark.slow
def test_m3_three_outputs_keep_float32s(int8_here, m3_folder) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m3 = M3Encoder(m3_folder, dtype="int8")
    # the load check pools to compare; the notice about a plain folder's pooling is not for M3
    assert not [w for w in caught if "modules.json" in str(w.message)]
    assert is_int8(m3.bert.model)
    got = m3_fidelity(m3, TEXTS)
    assert got["colbert_cosine_mean"] < 1 - 1e-5, got  # int8 ran
    assert got["dense_min_cosine"] >= MIN_COSINE, got
    assert got["dense_mean_cosine"] >= MEAN_COSINE, got
    assert got["dense_mean_kept"] >= NEIGHBOURS_KEPT, got
    assert got["lexical_kept_mean"] >= NEIGHBOURS_KEPT, got
    assert got["colbert_cosine_min"] >= MIN_COSINE, got
    assert got["colbert_cosine_mean"] >= MEAN_COSINE, got
