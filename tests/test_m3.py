"""``bertattn.M3Encoder`` (bge-m3's dense, sparse and ColBERT outputs) on a random-weight
XLM-RoBERTa folder with seeded ``colbert_linear.pt`` / ``sparse_linear.pt``, against
FlagEmbedding's formulas written out here on transformers' hidden states (one forward per text,
no padding): dense = normalized first token; lexical weights = relu(sparse_linear(h)) per token,
the largest per token id, special and unknown tokens left out, keyed by ``str(id)``; ColBERT =
normalized colbert_linear(h[1:]). No bge-m3 checkpoint is installable here (the package index
was searched for one bundled in a package: ``bge-m3-lite`` and ``m3serve`` download it), so the
weights are random."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import M3Encoder
from bertattn.errors import ModelFolderError

TEXTS = [
    "the attention head looks at every token in the sentence, every token",
    "hello world, a model and a layer",
    "un modèle multilingue lit aussi le français ж",  # ж: not in the vocabulary (<unk>)
    "queries",
]
PAIRS = [
    ("what does attention look at?", "the attention head looks at every token"),
    ("hello", "hello world, a model and a layer"),
    ("queries, keys and values", "softmax over the scaled dot products"),
]


def save_m3(path: Path, colbert_dim: int = 24) -> Path:
    """A random-weight XLM-RoBERTa folder (hidden 32) at ``path`` with seeded
    ``colbert_linear.pt`` (``colbert_dim`` outputs) and ``sparse_linear.pt``."""
    from test_family_roberta import save_family

    out = save_family("xlm-roberta", path, seed=2)
    g = torch.Generator().manual_seed(7)
    hidden = 32
    torch.save(
        {
            "weight": torch.randn(colbert_dim, hidden, generator=g) * 0.3,
            "bias": torch.randn(colbert_dim, generator=g),
        },
        out / "colbert_linear.pt",
    )
    torch.save(
        {"weight": torch.randn(1, hidden, generator=g) * 0.3, "bias": torch.zeros(1) + 0.05},
        out / "sparse_linear.pt",
    )
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_m3(tmp_path_factory.mktemp("m3") / "m3")


@pytest.fixture(scope="module")
def oracle(folder):  # type: ignore[no-untyped-def]
    """FlagEmbedding's formulas on transformers' hidden states, one text at a time."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    colbert = torch.load(folder / "colbert_linear.pt", weights_only=True)
    sparse = torch.load(folder / "sparse_linear.pt", weights_only=True)
    unused = {tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id}

    def run(text: str, max_length: int = 512, pooling: str = "cls") -> dict:
        enc = tok(text, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]  # (n, E)
        first = h[0] if pooling == "cls" else h.mean(0)
        dense = torch.nn.functional.normalize(first, dim=-1).numpy()
        w = torch.relu(h @ sparse["weight"].T + sparse["bias"])[:, 0]  # (n,)
        lexical: dict[str, float] = {}
        for token_id, weight in zip(enc["input_ids"][0].tolist(), w.tolist(), strict=True):
            if token_id not in unused and weight > 0:
                lexical[str(token_id)] = max(lexical.get(str(token_id), 0.0), weight)
        vecs = h[1:] @ colbert["weight"].T + colbert["bias"]
        colbert_vecs = torch.nn.functional.normalize(vecs, dim=-1).numpy()
        return {
            "dense": dense,
            "lexical": lexical,
            "colbert": colbert_vecs,
            "ids": enc["input_ids"],
        }

    run.unk = tok.unk_token_id  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def m3(folder) -> M3Encoder:
    return M3Encoder(folder, threads=1)


def assert_lexical_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)  # the same ids, in the order they first occur
    np.testing.assert_allclose(list(got.values()), list(want.values()), atol=1e-5)


def test_three_outputs_equal_flagembedding_formulas(m3, oracle, mkl_products):
    out = m3.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    assert sorted(out) == ["colbert_vecs", "dense_vecs", "lexical_weights"]
    assert out["dense_vecs"].shape == (4, 32) and out["dense_vecs"].dtype == np.float32
    assert oracle.unk in oracle(TEXTS[2])["ids"][0].tolist()  # the unknown token is there
    for i, text in enumerate(TEXTS):
        want = oracle(text)
        np.testing.assert_allclose(out["dense_vecs"][i], want["dense"], atol=1e-5)
        assert_lexical_equal(out["lexical_weights"][i], want["lexical"])
        assert all(isinstance(k, str) and isinstance(v, float) for k, v in want["lexical"].items())
        assert out["colbert_vecs"][i].shape == want["colbert"].shape  # (n - 1, 24): </s> kept
        np.testing.assert_allclose(out["colbert_vecs"][i], want["colbert"], atol=1e-5)
    # the sparse weights are not trivial: some tokens weigh nothing, one id repeats
    assert 0 < len(out["lexical_weights"][0]) < len(oracle(TEXTS[0])["ids"][0])


def test_flags_single_text_truncation_and_mean_pooling(m3, folder, oracle, mkl_products):
    out = m3.encode(TEXTS[0])  # FlagEmbedding's defaults: dense only
    assert out["lexical_weights"] is None and out["colbert_vecs"] is None
    np.testing.assert_allclose(out["dense_vecs"], oracle(TEXTS[0])["dense"], atol=1e-5)
    out = m3.encode(TEXTS[0], max_length=6, return_dense=False, return_colbert_vecs=True)
    want = oracle(TEXTS[0], max_length=6)
    assert out["dense_vecs"] is None and out["colbert_vecs"].shape == (5, 24)
    np.testing.assert_allclose(out["colbert_vecs"], want["colbert"], atol=1e-5)
    mean = M3Encoder(folder, pooling_method="mean", threads=1).encode(TEXTS)["dense_vecs"]
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(mean[i], oracle(text, pooling="mean")["dense"], atol=1e-5)


def test_batch_independence(m3):
    full = m3.encode(TEXTS, batch_size=4, return_sparse=True, return_colbert_vecs=True)
    one = m3.encode(TEXTS, batch_size=1, return_sparse=True, return_colbert_vecs=True)
    np.testing.assert_allclose(full["dense_vecs"], one["dense_vecs"], atol=1e-6)
    for a, b in zip(full["colbert_vecs"], one["colbert_vecs"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(full["lexical_weights"], one["lexical_weights"], strict=True):
        assert_lexical_equal(a, b)


def test_compute_score_equals_formulas(m3, oracle, mkl_products):
    def scores(q: dict, p: dict) -> tuple[float, float, float]:
        dense = float(q["dense"] @ p["dense"])
        sparse = sum(w * p["lexical"][t] for t, w in q["lexical"].items() if t in p["lexical"])
        colbert = float((q["colbert"] @ p["colbert"].T).max(1).sum() / len(q["colbert"]))
        return dense, sparse, colbert

    for weights, norm in ((None, (1.0, 1.0, 1.0)), ([0.4, 0.2, 0.4], (0.4, 0.2, 0.4))):
        got = m3.compute_score(PAIRS, weights_for_different_modes=weights)
        assert list(got) == ["colbert", "sparse", "dense", "sparse+dense", "colbert+sparse+dense"]
        for i, (a, b) in enumerate(PAIRS):
            d, s, c = scores(oracle(a), oracle(b))
            wd, ws, wc = norm
            assert got["dense"][i] == pytest.approx(d, abs=1e-5)
            assert got["sparse"][i] == pytest.approx(s, abs=1e-5)
            assert got["colbert"][i] == pytest.approx(c, abs=1e-5)
            assert got["sparse+dense"][i] == pytest.approx((s * ws + d * wd) / (ws + wd), abs=1e-5)
            total = (c * wc + s * ws + d * wd) / (wd + ws + wc)
            assert got["colbert+sparse+dense"][i] == pytest.approx(total, abs=1e-5)
    one = m3.compute_score(PAIRS[0])
    assert isinstance(one["dense"], float)
    assert one["dense"] == pytest.approx(m3.compute_score(PAIRS)["dense"][0], abs=1e-6)


def test_score_helpers(m3, folder):
    import transformers

    out = m3.encode(TEXTS[:2], return_sparse=True, return_colbert_vecs=True)
    lw = out["lexical_weights"]
    shared = set(lw[0]) & set(lw[1])
    want = sum(lw[0][t] * lw[1][t] for t in shared)
    assert m3.compute_lexical_matching_score(lw[0], lw[1]) == pytest.approx(want)
    matrix = m3.compute_lexical_matching_score(lw, lw)
    assert matrix.shape == (2, 2) and matrix[0, 1] == pytest.approx(want)
    q, p = out["colbert_vecs"]
    want = (q @ p.T).max(1).mean()
    assert float(m3.colbert_score(q, p)) == pytest.approx(float(want), abs=1e-6)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for d in lw:
        assert m3.convert_id_to_token(d) == {tok.decode([int(k)]): v for k, v in d.items()}
    assert m3.convert_id_to_token(lw) == [m3.convert_id_to_token(d) for d in lw]


def _copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    return out


def test_bad_folders_are_refused(folder, tmp_path):
    copy = _copy(folder, tmp_path)
    (copy / "sparse_linear.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"sparse_linear.pt is missing: a bge-m3 folder"):
        M3Encoder(copy)
    torch.save({"weight": torch.zeros(1, 16), "bias": torch.zeros(1)}, copy / "sparse_linear.pt")
    with pytest.raises(ModelFolderError, match=r"weight \(1, 16\) .* hidden size 32"):
        M3Encoder(copy)
    torch.save({"weight": torch.zeros(1, 32)}, copy / "sparse_linear.pt")
    with pytest.raises(ModelFolderError, match=r"with 'weight' and 'bias', got \['weight'\]"):
        M3Encoder(copy)
    torch.save(
        {"weight": torch.zeros(1, 32), "bias": torch.zeros(1), "when": datetime.date(2026, 1, 1)},
        copy / "sparse_linear.pt",
    )
    with pytest.raises(ModelFolderError, match=r"cannot be read as a state dict of tensors"):
        M3Encoder(copy)


def test_bad_arguments_are_refused(m3):
    with pytest.raises(ValueError, match=r"all False: ask for at least one output"):
        m3.encode(TEXTS, return_dense=False)
    with pytest.raises(ValueError, match=r"keyword argument\(s\) it does not take: colour"):
        m3.encode(TEXTS, colour="red")
    with pytest.raises(ValueError, match=r"max_length=2 is out of range"):
        m3.encode(TEXTS, max_length=2)
    with pytest.raises(TypeError, match=r"sentence_pairs\[1\] must be a \(query, passage\) pair"):
        m3.compute_score([("a", "b"), "c"])
    with pytest.raises(ValueError, match=r"weights_for_different_modes must hold 3 weights"):
        m3.compute_score(PAIRS, weights_for_different_modes=[1.0, 1.0])
    with pytest.raises(
        ValueError, match=r"pooling_method 'last_token' is not supported; use one of 'cls', 'mean'"
    ):
        M3Encoder("unused", pooling_method="last_token")


def test_truncate_dim_and_query_corpus_lengths(folder, oracle, mkl_products):
    """FlagEmbedding's truncate_dim: the first dimensions of dense and ColBERT, then normalized;
    encode_queries / encode_corpus cut at query_max_length / passage_max_length."""
    m3 = M3Encoder(folder, truncate_dim=8, query_max_length=5, passage_max_length=9, threads=1)
    out = m3.encode(TEXTS[:2], return_colbert_vecs=True)
    for i, text in enumerate(TEXTS[:2]):
        want = oracle(text, max_length=9)  # encode's default: passage_max_length
        full_dense = want["dense"]  # normalized over 32 dims; truncation renormalizes its 8
        np.testing.assert_allclose(
            out["dense_vecs"][i], full_dense[:8] / np.linalg.norm(full_dense[:8]), atol=1e-5
        )
        # colbert: colbert_linear(h)[:8] normalized (renormalizing the normalized rows is the same)
        cut = want["colbert"][:, :8]
        np.testing.assert_allclose(
            out["colbert_vecs"][i], cut / np.linalg.norm(cut, axis=1, keepdims=True), atol=1e-5
        )
    assert m3.encode_queries(TEXTS[0], return_colbert_vecs=True)["colbert_vecs"].shape == (4, 8)
    assert m3.encode_corpus(TEXTS[0], return_colbert_vecs=True)["colbert_vecs"].shape == (8, 8)
