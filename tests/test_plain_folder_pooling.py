"""A plain Hugging Face folder (no sentence-transformers ``modules.json``) is pooled as
sentence-transformers pools it: mean, with a one-line notice naming the folder and "mean
pooling"; the [CLS] state stays available by name. Checked against
``sentence_transformers.SentenceTransformer`` on the same folder, through the Python API, the
command line and the server.

The folder is the bundled all-MiniLM-L6-v2's BERT weights written by transformers'
``save_pretrained`` without the sentence-transformers files.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from serve_server import running_server

import bertattn

TEXTS = ["The cat sat on the mat.", "A much longer sentence about attention and its heads, padded."]
#: the cosine between bertattn's and sentence-transformers' rows of one text
COSINE = 0.99999


@pytest.fixture(scope="module")
def plain_folder(minilm_dir, tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("plain-minilm")
    transformers.BertModel.from_pretrained(minilm_dir).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(folder)
    assert not (folder / "modules.json").exists()
    return folder


@pytest.fixture(scope="module")
def st_rows(plain_folder) -> np.ndarray:
    """sentence-transformers' own embeddings of TEXTS on the plain folder."""
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(plain_folder), device="cpu").encode(TEXTS)


@pytest.fixture(scope="module")
def cls_rows(plain_folder) -> np.ndarray:
    """transformers' [CLS] states of TEXTS (the first token's last hidden state)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(plain_folder)
    model = transformers.BertModel.from_pretrained(plain_folder).eval()
    with torch.no_grad():
        out = model(**tok(TEXTS, padding=True, return_tensors="pt"))
    return out.last_hidden_state[:, 0].numpy()


def assert_rows_match(got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= COSINE, cos


def notices(text: str, folder: Path) -> list[str]:
    return [x for x in text.splitlines() if "mean pooling" in x and str(folder) in x]


def test_python_mean_pools_a_plain_folder_as_sentence_transformers(plain_folder, st_rows, caplog):
    bert = bertattn.Bert.load(plain_folder)
    assert bert.pooling == "mean"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert_rows_match(bert.encode(TEXTS), st_rows)
        bert.encode(TEXTS)  # said once per model, not once per call
    assert len(notices("\n".join(str(w.message) for w in said), plain_folder)) == 1, said


def test_cls_stays_available_by_name_without_the_notice(plain_folder, cls_rows):
    bert = bertattn.Bert.load(plain_folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice: the pooling was asked for
        got = bert.encode(TEXTS, pooling="cls")
    np.testing.assert_allclose(got, cls_rows, atol=1e-5, rtol=1e-4)


def test_a_sentence_transformers_folder_says_nothing(minilm_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bertattn.Bert.load(minilm_dir).encode(TEXTS[:1])


def test_the_cli_mean_pools_and_says_so(plain_folder, st_rows, cls_rows, cli, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    r = cli("encode", src, "-o", tmp_path / "mean.npy", "--model", plain_folder, "-q")
    assert r.code == 0, r
    assert len(notices(r.err, plain_folder)) == 1, r
    assert_rows_match(np.load(tmp_path / "mean.npy"), st_rows)
    r = cli("encode", src, "-o", tmp_path / "cls.npy", "--model", plain_folder, "-q",
            "--pooling", "cls")  # fmt: skip
    assert r.code == 0 and not notices(r.err, plain_folder), r
    np.testing.assert_allclose(np.load(tmp_path / "cls.npy"), cls_rows, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_the_server_mean_pools_and_says_so(plain_folder, st_rows, cli_subprocess):
    with running_server(cli_subprocess, plain_folder) as server:
        info = httpx.get(server.url + "/info", timeout=30).json()
        body = {"model": plain_folder.name, "input": TEXTS}
        got = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert got.status_code == 200, got.text
        rows = np.array([d["embedding"] for d in got.json()["data"]])
        stderr = server.stderr()
    assert info["pooling"] == "mean", info
    assert_rows_match(rows, st_rows)
    assert len(notices(stderr, plain_folder)) == 1, stderr


def test_token_rows_alone_say_nothing_of_pooling(plain_folder):
    bert = bertattn.Bert.load(plain_folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # token rows are not pooled: no notice
        bert.encode(TEXTS, output_value="token_embeddings")
    with pytest.warns(UserWarning, match="mean pooling"):  # still said for the first pooled rows
        bert.encode(TEXTS)
