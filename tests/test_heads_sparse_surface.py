"""``SparseEncoder``'s sentence-transformers surface beyond ``encode``, against
sentence-transformers' own ``SparseEncoder`` on the same real SPLADE folder: NumPy input,
``similarity_fn_name`` (on the model, in the folder, refused by name), prompts (``prompt_name=None``
passed explicitly, ``model.prompts = ...`` after loading, ``default_prompt_name``), ``device``,
``similarity_pairwise``, ``intersection``; and rows made sparse batch by batch (the peak memory
of a large input is one batch's dense rows, not the input's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from test_heads_sparse import same_rows, st_sparse

from bertattn import SparseEncoder

TEXTS = ["the cat sat on the mat", "hello world", "a query looks at every key", "a dog"]


@pytest.fixture(scope="module")
def pair(splade_dir):  # type: ignore[no-untyped-def]
    return SparseEncoder(splade_dir, threads=1), st_sparse(splade_dir)


def test_a_numpy_array_of_strings_is_a_batch(pair):
    ours, theirs = pair
    array = np.array(TEXTS)
    got = ours.encode(array)
    assert got.shape == (4, ours.vocab_size) and got.is_sparse
    same_rows(got, theirs.encode(array))
    same_rows(ours.encode(np.array(TEXTS, dtype=object)), ours.encode(TEXTS))
    assert ours.encode(np.array([], dtype=str)).shape == (0, ours.vocab_size)
    # an (N, 2) array is N text pairs (tests/test_heads_st_promises_r5.py); other widths are refused
    with pytest.raises(ValueError, match=r"2-D NumPy array of shape \(2, 3\); pass a 1-D"):
        ours.encode(np.array([TEXTS[:3], TEXTS[1:]]))
    with pytest.raises(ValueError, match=r"3-D NumPy array"):
        ours.encode(np.array([[TEXTS[:2]]]))
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a string"):
        ours.encode(["ok", 3])


@pytest.mark.parametrize("name", ["dot", "cosine", "euclidean", "manhattan"])
def test_similarity_fn_name_on_the_model(pair, name):
    ours, theirs = pair
    rows = ours.encode(TEXTS)
    dense = ours.encode(TEXTS, convert_to_sparse_tensor=False)
    ours.similarity_fn_name, theirs.similarity_fn_name = name, name
    try:
        want = theirs.similarity(rows, rows)
        # sentence-transformers' euclidean goes through a matrix product: a row against
        # itself comes out up to ~2e-3 from 0 there; bertattn's is exact
        atol = 3e-3 if name == "euclidean" else 1e-4
        got = ours.similarity(rows, rows)
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)
        if name in ("euclidean", "manhattan"):
            assert torch.diagonal(got).abs().max() == 0
        pairwise = theirs.similarity_pairwise(dense[:2], dense[2:])
        torch.testing.assert_close(
            ours.similarity_pairwise(dense[:2], dense[2:]), pairwise, atol=1e-4, rtol=1e-5
        )
    finally:
        ours.similarity_fn_name = theirs.similarity_fn_name = None
    if name == "cosine":
        assert torch.diagonal(want).tolist() == pytest.approx([1.0] * 4, abs=1e-5)
    assert ours.similarity_fn_name == "dot"


def test_similarity_fn_name_refused_by_name(pair, splade_dir):
    ours, _ = pair
    for bad in ("maxsim", "jaccard"):
        with pytest.raises(ValueError, match=r"use one of cosine, dot, euclidean, manhattan"):
            ours.similarity_fn_name = bad
    with pytest.raises(ValueError, match="MaxSim is late interaction"):
        SparseEncoder(splade_dir, similarity_fn_name="maxsim")
    assert ours.similarity_fn_name == "dot"


def test_similarity_fn_name_from_the_folder(splade_dir, tmp_path):
    theirs = st_sparse(splade_dir)
    theirs.similarity_fn_name = "cosine"
    theirs.save(str(tmp_path / "st"))
    ours = SparseEncoder(tmp_path / "st", threads=1)
    assert ours.similarity_fn_name == "cosine"
    rows = ours.encode(TEXTS)
    torch.testing.assert_close(
        ours.similarity(rows, rows), st_sparse(tmp_path / "st").similarity(rows, rows),
        atol=1e-4, rtol=1e-5,
    )  # fmt: skip
    assert torch.diagonal(ours.similarity(rows, rows)).tolist() == pytest.approx([1.0] * 4)
    assert SparseEncoder(tmp_path / "st", similarity_fn_name="dot").similarity_fn_name == "dot"


def test_prompts_as_sentence_transformers_applies_them(pair):
    ours, theirs = pair
    before = dict(ours.prompts)
    try:
        ours.prompts = {"query": "query: ", "passage": "passage: "}
        theirs.prompts = {"query": "query: ", "passage": "passage: "}
        for call in (
            lambda m: m.encode_query(TEXTS[:2], prompt_name=None),
            lambda m: m.encode_query(TEXTS[:2], prompt=None),
            lambda m: m.encode_document(TEXTS[:2], prompt_name=None),
            lambda m: m.encode(TEXTS[:2], prompt_name="passage"),
        ):
            same_rows(call(ours), call(theirs))
        assert not torch.equal(
            ours.encode_query(TEXTS[:1], prompt_name=None).to_dense(),
            ours.encode(TEXTS[:1]).to_dense(),
        )  # the query prompt took effect
        ours.default_prompt_name = theirs.default_prompt_name = "query"
        same_rows(ours.encode(TEXTS[:2]), theirs.encode(TEXTS[:2]))
        same_rows(ours.encode(TEXTS[:2]), ours.encode(TEXTS[:2], prompt="query: "))
    finally:
        ours.prompts, ours.default_prompt_name = before, None
        theirs.default_prompt_name = None


def test_prompt_arguments_at_construction(splade_dir):
    model = SparseEncoder(
        splade_dir, threads=1, prompts={"query": "q: "}, default_prompt_name="query"
    )
    assert model.prompts["query"] == "q: " and model.default_prompt_name == "query"
    same_rows(model.encode(TEXTS[:2]), model.encode(TEXTS[:2], prompt="q: "))
    with pytest.raises(ValueError, match=r"Default prompt name 'nope' not found in the config"):
        SparseEncoder(splade_dir, default_prompt_name="nope")


def test_device_and_intersection(pair):
    ours, theirs = pair
    assert ours.device == torch.device("cpu") == theirs.device
    q = ours.encode_query("the cat")
    docs = ours.encode_document(["the cat sat on the mat", "a dog"])
    got, want = ours.intersection(q, docs), theirs.intersection(q, docs)
    assert got.is_sparse and got.shape == want.shape == docs.shape
    torch.testing.assert_close(got.to_dense(), want.to_dense())
    first = ours.encode_document("the cat sat on the mat")
    one = ours.intersection(q, first)
    torch.testing.assert_close(one.to_dense(), theirs.intersection(q, first).to_dense())
    assert ours.decode(one, top_k=1)[0][0] in {t for t, _ in ours.decode(q)}
    with pytest.raises(ValueError, match=r"embeddings_1 must be one \(V,\) row"):
        ours.intersection(docs, docs)


_PEAK = """
import resource, sys, torch
from bertattn import SparseEncoder
model = SparseEncoder(sys.argv[1], threads=1)
texts = [f"text number {i} about cats and attention" for i in range(int(sys.argv[2]))]
model.encode(texts[:64])  # the same batches' working memory, once
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rows = model.encode(texts)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) * 1024, rows.shape[0], rows.shape[1])
"""


def test_rows_are_made_sparse_batch_by_batch(splade_dir):
    n = 3000
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PEAK), str(splade_dir), str(n)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    grew, rows, vocab = map(int, out.stdout.split())
    assert rows == n
    dense = n * vocab * 4  # the (N, V) float32 rows stacked before they were made sparse
    mib = 2**20
    assert grew < dense / 3, f"peak grew {grew / mib:.0f} MiB; (N, V) dense: {dense / mib:.0f}"


def test_settings_read_as_sentence_transformers_names_them(pair):
    ours, theirs = pair
    assert ours.max_seq_length == theirs.max_seq_length == ours.get_max_seq_length()
    width = theirs.encode(["a text"]).shape[1]
    assert ours.get_sentence_embedding_dimension() == ours.get_embedding_dimension() == width
    assert tuple(ours.SUPPORTED_SIMILARITY_FN_NAMES) == tuple(theirs.SUPPORTED_SIMILARITY_FN_NAMES)
    assert ours.dtype == torch.float32


_ST = "sentence_transformers."
_CSR = [
    f"{_ST}base.modules.Transformer",
    f"{_ST}sentence_transformer.modules.Pooling",
    f"{_ST}sparse_encoder.modules.SparseAutoEncoder",
]
_INFERENCE_FREE = [f"{_ST}base.modules.Router"]


@pytest.mark.parametrize(
    ("types", "named"),
    [
        (_CSR, r"entry 2 is sentence_transformers\..*\.SparseAutoEncoder: CSR \(a"),
        (_INFERENCE_FREE, r"entry 0 is sentence_transformers\.base\.modules\.Router: inference"),
    ],
    ids=["csr", "inference-free"],
)  # fmt: skip
def test_sparse_architectures_that_are_not_splade_are_refused_by_name(tmp_path, types, named):
    from bertattn.errors import ModelFolderError

    modules = [{"idx": i, "name": str(i), "path": "", "type": t} for i, t in enumerate(types)]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFolderError, match=named) as info:
        SparseEncoder(tmp_path)
    assert "load it with sentence-transformers' SparseEncoder" in str(info.value)


def test_encode_takes_inputs_by_sentence_transformers_6_name(pair) -> None:  # type: ignore[no-untyped-def]
    """``encode(inputs=...)`` (sentence-transformers 6's name) and ``sentences=`` (its older
    one) give the same rows; both, or neither, is a TypeError naming them."""
    model, theirs = pair
    texts = ["the attention head", "a model"]
    a = model.encode(inputs=texts, convert_to_sparse_tensor=False)
    b = model.encode(sentences=texts, convert_to_sparse_tensor=False)
    torch.testing.assert_close(a, b)
    want = theirs.encode(inputs=texts, convert_to_sparse_tensor=False)
    torch.testing.assert_close(a, want.to(a.dtype), atol=1e-5, rtol=0)
    q = model.encode_query(inputs=texts, convert_to_sparse_tensor=False)
    torch.testing.assert_close(q, model.encode_query(texts, convert_to_sparse_tensor=False))
    with pytest.raises(TypeError, match="not both"):
        model.encode(texts, sentences=texts)
    with pytest.raises(TypeError, match="got neither"):
        model.encode()
    with pytest.raises(ValueError, match="MultiVectorEncoder"):
        model.similarity_fn_name = "maxsim"
