"""The constructor keywords model cards pass to sentence-transformers' head classes, taken by
bertattn's ``CrossEncoder``, ``SparseEncoder`` and ``MultiVectorEncoder`` (issue 58):
``revision`` / ``local_files_only`` / ``cache_folder`` / ``token`` through the resolver (a hub
name read from a Hugging Face cache laid out in the test), ``torch_dtype`` / ``model_kwargs`` /
``automodel_args`` as ``dtype``, ``trust_remote_code`` noted, ``num_labels`` checked, and any
other keyword refused by name with bertattn's equivalent."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from test_heads_cross_encoder import save_classifier
from test_multi_vector import build

from bertattn import CrossEncoder, MultiVectorEncoder, SparseEncoder
from bertattn.errors import ModelFolderError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PAIRS = [("a query", "a passage about it"), ("hello", "world")]


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("card_rr"), 1, seed=7)


@pytest.fixture(scope="module")
def multi_vector(tiny_checkpoint, tmp_path_factory) -> Path:
    return build(tiny_checkpoint, tmp_path_factory.mktemp("card_mv") / "mv", width=16)


def hub_cache(root: Path, name: str, folder: Path) -> Path:
    """A Hugging Face cache at ``root`` holding ``folder`` as ``org/<name>`` at :data:`COMMIT`
    (``refs/main`` pointing at it), laid out as huggingface_hub lays it out."""
    repo = root / f"models--org--{name}"
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """No network (a dead endpoint), hub downloads allowed by the environment, an empty default
    cache, and a working folder where ``org/...`` is no local folder."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "default-cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------- the resolver's keywords
def test_cross_encoder_reads_a_revision_from_the_cache_folder_given(reranker, elsewhere):
    cache = hub_cache(elsewhere / "cards", "rr", reranker)
    want = CrossEncoder(reranker, threads=1).predict(PAIRS)
    model = CrossEncoder(
        "org/rr", cache_folder=str(cache), revision=COMMIT, local_files_only=True, threads=1
    )
    torch.testing.assert_close(model.predict(PAIRS), want, rtol=0, atol=0)
    # without cache_folder the default (empty) cache is read: not found, and no download tried
    with pytest.raises(FileNotFoundError, match="local_files_only=True forbids downloading"):
        CrossEncoder("org/rr", local_files_only=True, threads=1)


def test_a_revision_not_in_the_cache_is_named_in_one_line(reranker, elsewhere):
    cache = hub_cache(elsewhere / "cards", "rr", reranker)
    with pytest.raises(FileNotFoundError) as err:
        CrossEncoder("org/rr", cache_folder=cache, revision="v9", local_files_only=True)
    msg = str(err.value)
    assert "\n" not in msg
    assert "'org/rr@v9' is not a local folder" in msg and "no revision 'v9'" in msg
    assert str(cache) in msg


def test_sparse_and_multi_vector_take_the_resolver_keywords(splade_dir, multi_vector, elsewhere):
    cache = hub_cache(elsewhere / "cards", "splade", splade_dir)
    hub_cache(cache, "mv", multi_vector)
    sparse = SparseEncoder("org/splade", cache_folder=cache, local_files_only=True, token=False)
    want = SparseEncoder(splade_dir).encode(["a text"], convert_to_tensor=True).to_dense()
    got = sparse.encode(["a text"], convert_to_tensor=True).to_dense()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    mv = MultiVectorEncoder("org/mv", cache_folder=cache, revision=COMMIT, local_files_only=True)
    want_rows = MultiVectorEncoder(multi_vector).encode_query(["a text"])[0]
    torch.testing.assert_close(mv.encode_query(["a text"])[0], want_rows, rtol=0, atol=0)
    with pytest.raises(FileNotFoundError, match="no revision 'v2'"):
        MultiVectorEncoder("org/mv", cache_folder=cache, revision="v2", local_files_only=True)


# ---------------------------------------------------------------------- dtype by other names
@pytest.mark.parametrize(
    "card",
    [
        {"torch_dtype": torch.float64},
        {"torch_dtype": "float64"},
        {"model_kwargs": {"torch_dtype": "float64"}},
        {"automodel_args": {"torch_dtype": torch.float64}},
        {"model_kwargs": {"dtype": "float64"}},
        {"dtype": "float64", "model_kwargs": {"torch_dtype": torch.float64}},
    ],
    ids=["torch_dtype", "name", "model_kwargs", "automodel_args", "model_kwargs-dtype", "both"],
)
def test_the_dtype_by_its_model_card_names(reranker, card):
    model = CrossEncoder(reranker, threads=1, **card)
    assert model.dtype == torch.float64


def test_sparse_and_multi_vector_take_torch_dtype(splade_dir, multi_vector):
    assert SparseEncoder(splade_dir, torch_dtype="float64").dtype == torch.float64
    mv = MultiVectorEncoder(multi_vector, model_kwargs={"torch_dtype": torch.float64})
    assert mv.dtype == torch.float64


def test_two_dtypes_that_disagree_are_refused(reranker):
    with pytest.raises(ValueError, match=r"dtype=float32 and torch_dtype=float64 disagree"):
        CrossEncoder(reranker, dtype="float32", torch_dtype="float64")
    with pytest.raises(ValueError, match="gives torch_dtype=float64 and dtype=float32"):
        CrossEncoder(reranker, model_kwargs={"torch_dtype": "float64", "dtype": "float32"})


# ------------------------------------------------------------ trust_remote_code, num_labels
def test_trust_remote_code_is_taken_and_noted(reranker, caplog):
    with caplog.at_level(logging.INFO, logger="bertattn.heads"):
        model = CrossEncoder(reranker, trust_remote_code=True, threads=1)
    assert model.num_labels == 1
    notes = [r.getMessage() for r in caplog.records if "trust_remote_code" in r.getMessage()]
    assert len(notes) == 1 and "no code from the model folder is run" in notes[0]


def test_num_labels_is_checked_against_the_folder(reranker):
    assert CrossEncoder(reranker, num_labels=1, threads=1).num_labels == 1
    with pytest.raises(ValueError) as err:
        CrossEncoder(reranker, num_labels=3)
    msg = str(err.value)
    assert "num_labels=3" in msg and "config.json has a head of 1 label(s)" in msg
    assert "\n" not in msg


# ---------------------------------------------------------------------- the rest refused by name
@pytest.mark.parametrize(
    ("cls", "card", "words"),
    [
        (CrossEncoder, {"cache_dir": "x"}, r"'cache_dir'; bertattn's equivalent is cache_folder="),
        (CrossEncoder, {"use_auth_token": "x"}, r"'use_auth_token'; .* equivalent is token="),
        (CrossEncoder, {"max_seq_length": 8}, r"'max_seq_length'; .* equivalent is max_length="),
        (CrossEncoder, {"default_activation_function": None}, r"equivalent is activation_fn="),
        (CrossEncoder, {"maxlength": 8}, r"'maxlength'; did you mean max_length=\?"),
        (CrossEncoder, {"model_kwargs": {"attn_implementation": "sdpa"}},
         r"model_kwargs\['attn_implementation'\]: bertattn's equivalent is backend="),
        (CrossEncoder, {"model_kwargs": "float16"}, r"model_kwargs must be a dict"),
        (SparseEncoder, {"num_labels": 2}, r"SparseEncoder\(\) got an unexpected keyword "
                                           r"argument 'num_labels'; it takes "),
        (SparseEncoder, {"zzz": 1}, r"'zzz'; it takes .*max_active_dims.*torch_dtype"),
        (MultiVectorEncoder, {"cache_dir": "x"}, r"equivalent is cache_folder="),
        (MultiVectorEncoder, {"revision": 3}, r"revision must be a str"),
        (SparseEncoder, {"cache_folder": 3}, r"cache_folder must be a folder path or None"),
        (CrossEncoder, {"token": 3}, r"token must be a hub token \(str\), True/False or None"),
    ],
)  # fmt: skip
def test_other_keywords_are_refused_with_the_equivalent(
    cls, card, words, reranker, splade_dir, multi_vector
):  # type: ignore[no-untyped-def]
    folder = {CrossEncoder: reranker, SparseEncoder: splade_dir}.get(cls, multi_vector)
    with pytest.raises(TypeError, match=words):
        cls(folder, **card)


def test_a_local_folder_ignores_the_hub_keywords(reranker):
    model = CrossEncoder(reranker, revision="v9", local_files_only=True, cache_folder="/nowhere")
    assert model.num_labels == 1


def test_a_bad_folder_is_still_a_folder_error(tmp_path):
    with pytest.raises(ModelFolderError):
        CrossEncoder(tmp_path, revision="main")
