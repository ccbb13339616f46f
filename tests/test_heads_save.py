"""``save`` / ``save_pretrained`` on ``CrossEncoder``, ``SparseEncoder`` and
``MultiVectorEncoder`` (issue 58): a model loaded, its settings changed (prompts, max length,
activation, similarity, ...), saved; the folder loaded by sentence-transformers and by bertattn
gives the same scores / rows as the model that saved it, with the settings kept. The folder
appears whole or not at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_heads_cross_encoder import save_classifier
from test_heads_sparse import same_rows
from test_multi_vector import assert_rows_equal, build

from bertattn import CrossEncoder, MultiVectorEncoder, SparseEncoder
from bertattn.heads import saving

PAIRS = [
    ("what is attention?", "attention lets every token look at every other token"),
    ("a dog", "the cat sat on the mat " * 12),  # cut at the saved max length
    ("hello", "world"),
]
TEXTS = ["the cat sat on the mat", "attention weighs every token " * 10, "a dog"]


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("save_rr"), 1, seed=8)


def test_cross_encoder_saved_loads_the_same_in_both(reranker, tmp_path):
    from sentence_transformers import CrossEncoder as STCrossEncoder

    model = CrossEncoder(reranker, threads=1, activation_fn=torch.nn.Identity(),
                         prompts={"q": "query: "}, default_prompt_name="q")  # fmt: skip
    model.max_seq_length = 24
    want = model.predict(PAIRS)
    out = model.save(tmp_path / "saved")
    assert out == (tmp_path / "saved").absolute()
    ours, theirs = CrossEncoder(out, threads=1), STCrossEncoder(str(out), device="cpu")
    assert ours.max_length == theirs.max_length == 24
    assert ours.prompts == theirs.prompts == {"q": "query: "}
    assert ours.default_prompt_name == theirs.default_prompt_name == "q"
    assert isinstance(theirs.activation_fn, torch.nn.Identity)
    np.testing.assert_allclose(ours.predict(PAIRS), want, rtol=0, atol=0)
    np.testing.assert_allclose(theirs.predict(PAIRS), want, rtol=0, atol=1e-5)
    assert not np.allclose(CrossEncoder(reranker, threads=1).predict(PAIRS), want, atol=1e-3)


def test_sparse_saved_from_a_plain_folder_loads_the_same_in_both(splade_dir, tmp_path):
    from sentence_transformers import SparseEncoder as STSparseEncoder

    model = SparseEncoder(splade_dir, threads=1, max_active_dims=40, prompts={"query": "q: "})
    model.max_seq_length = 12
    model.similarity_fn_name = "cosine"
    want = model.encode_query(TEXTS, convert_to_tensor=True)
    out = model.save_pretrained(tmp_path / "splade")
    ours, theirs = SparseEncoder(out, threads=1), STSparseEncoder(str(out), device="cpu")
    assert ours.max_seq_length == theirs.max_seq_length == 12
    assert ours.max_active_dims == theirs.max_active_dims == 40
    assert ours.similarity_fn_name == theirs.similarity_fn_name == "cosine"
    assert ours.prompts["query"] == theirs.prompts["query"] == "q: "
    same_rows(ours.encode_query(TEXTS, convert_to_tensor=True), want)
    same_rows(theirs.encode_query(TEXTS, convert_to_tensor=True), want)


def test_multi_vector_saved_loads_the_same_in_both(tiny_checkpoint, tmp_path):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    source = build(tiny_checkpoint, tmp_path / "mv", width=16)
    model = MultiVectorEncoder(source, threads=1, truncate_dim=8)
    model.prompts = {"query": "query: ", "document": "passage: "}
    model.similarity_fn_name = "meanmaxsim"
    want_q, want_d = model.encode_query(TEXTS), model.encode_document(TEXTS)
    out = model.save(tmp_path / "saved")
    ours, theirs = MultiVectorEncoder(out, threads=1), STMultiVectorEncoder(str(out), device="cpu")
    assert ours.truncate_dim == theirs.truncate_dim == 8
    assert ours.similarity_fn_name == theirs.similarity_fn_name == "meanmaxsim"
    assert ours.prompts == theirs.prompts == model.prompts
    assert_rows_equal(ours.encode_query(TEXTS), want_q, atol=0)
    assert_rows_equal(ours.encode_document(TEXTS), want_d, atol=0)
    assert_rows_equal(list(theirs.encode_query(TEXTS)), want_q)
    assert_rows_equal(list(theirs.encode_document(TEXTS)), want_d)


def test_a_folder_with_files_is_not_written_over(reranker, tmp_path):
    model = CrossEncoder(reranker, threads=1)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="exists and is not an empty folder"):
        model.save(tmp_path / "taken")
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    assert (model.save(tmp_path / "empty") / "config.json").is_file()
    with pytest.raises(ValueError, match="inside the model's own folder"):
        model.save(reranker / "copy")


def test_a_failed_save_leaves_nothing(reranker, tmp_path, monkeypatch):
    model = CrossEncoder(reranker, threads=1)

    def broken(path, keys):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(saving, "_merge_json", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_folders_max_active_dims_is_read_and_checked(splade_dir, tmp_path):
    import json

    from bertattn.errors import ModelFolderError

    out = SparseEncoder(splade_dir, threads=1, max_active_dims=5).save(tmp_path / "k5")
    assert SparseEncoder(out, threads=1).max_active_dims == 5
    assert SparseEncoder(out, threads=1, max_active_dims=9).max_active_dims == 9
    path = out / "config_sentence_transformers.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_active_dims": 0}))
    with pytest.raises(ModelFolderError, match="max_active_dims must be null or an int >= 1"):
        SparseEncoder(out)
