"""``SparseEncoder`` and ``CrossEncoder`` called as sentence-transformers 6 calls them (issue 45),
against sentence-transformers' own classes on the same folders: ``encode_query`` /
``encode_document`` calling ``encode`` by keyword with ``task=``, ``encode(task=)``, text pairs
(an ``(N, 2)`` NumPy array, ``[text, pair]`` lists), per-call ``processing_kwargs``, the messages
whose words sentence-transformers' tests match, ``rank()``'s deprecated keywords through the
logger, ``rank()`` on a multi-label model, ``is_singular_input``."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from test_heads_cross_encoder import save_classifier
from test_heads_sparse import same_rows, st_sparse

from bertattn import CrossEncoder, SparseEncoder

TEXTS = ["the cat sat on the mat", "hello world", "a query looks at every key", "a dog"]
PAIRS = [
    ["what is attention?", "attention lets every token look at every other token"],
    ["a dog", "the cat sat on the mat"],
    ["this is a moderately long query sentence", "this is a moderately long candidate sentence"],
]
LONG = "this sentence is much longer than four tokens for sure"


@pytest.fixture(scope="module")
def sparse(splade_dir):  # type: ignore[no-untyped-def]
    return SparseEncoder(splade_dir, threads=1), st_sparse(splade_dir)


@pytest.fixture
def prompted(sparse):  # type: ignore[no-untyped-def]
    """Both models with ``prompts`` set (restored after the test)."""
    ours, theirs = sparse
    before, before_theirs = dict(ours.prompts), dict(theirs.prompts)
    yield ours, theirs
    ours.prompts, theirs.prompts = before, before_theirs


def calls_of(model, method, monkeypatch, **kwargs):  # type: ignore[no-untyped-def]
    """The ``(args, kwargs)`` ``model.method(**kwargs)`` calls ``model.encode`` with."""
    seen: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(model, "encode", lambda *a, **k: seen.append((a, k)))
    getattr(model, method)(**kwargs)
    monkeypatch.undo()
    assert len(seen) == 1
    return seen[0]


QUERY_PROMPTS = {"query": "query: ", "custom": "custom: "}
DOC_PROMPTS = {"document": "document: ", "passage": "passage: ", "corpus": "corpus: ", "x": "x: "}


@pytest.mark.parametrize("method", ["encode_query", "encode_document"])
@pytest.mark.parametrize(
    "prompts",
    [QUERY_PROMPTS, DOC_PROMPTS, {"passage": "p: ", "corpus": "c: "}, {"corpus": "c: "}, {}],
)
@pytest.mark.parametrize(
    "given",
    [
        {},
        {"prompt_name": "custom"},
        {"prompt": "Custom prompt: "},
        {"prompt": "Custom prompt: ", "prompt_name": "x"},
        {"prompt_name": None, "prompt": None},
    ],
)
@pytest.mark.parametrize("texts_as", ["inputs", "sentences"])
def test_encode_query_and_document_call_encode_by_keyword_as_sentence_transformers(
    prompted, monkeypatch, method, prompts, given, texts_as
):  # type: ignore[no-untyped-def]
    ours, theirs = prompted
    ours.prompts, theirs.prompts = dict(prompts), dict(prompts)
    kwargs = {texts_as: TEXTS[:2], "batch_size": 8, "convert_to_sparse_tensor": False, **given}
    our_args, our_kwargs = calls_of(ours, method, monkeypatch, **kwargs)
    their_args, their_kwargs = calls_of(theirs, method, monkeypatch, **kwargs)
    assert our_args == their_args == ()
    named = ("inputs", "prompt_name", "prompt", "task", "batch_size", "convert_to_sparse_tensor")
    for key in named:
        assert key in our_kwargs, key
    assert "sentences" not in our_kwargs
    for key, value in our_kwargs.items():
        assert their_kwargs[key] == value, key  # sentence-transformers also passes its defaults
    assert our_kwargs["task"] == ("query" if method == "encode_query" else "document")


def test_encode_query_and_document_rows_with_the_task_prompts(prompted):  # type: ignore[no-untyped-def]
    ours, theirs = prompted
    ours.prompts = theirs.prompts = {"query": "query: ", "passage": "passage: "}
    same_rows(ours.encode_query(TEXTS), theirs.encode_query(TEXTS))
    same_rows(ours.encode_document(TEXTS), theirs.encode_document(TEXTS))
    same_rows(ours.encode_query(sentences=TEXTS[:2]), theirs.encode_query(sentences=TEXTS[:2]))
    same_rows(
        ours.encode_document(TEXTS, prompt="p: "), theirs.encode_document(TEXTS, prompt="p: ")
    )
    with pytest.raises(TypeError, match=r"encode_query\(\) sets task='query' itself"):
        ours.encode_query(TEXTS, task="document")
    with pytest.raises(TypeError, match="as inputs .* or as sentences=, not both"):
        ours.encode_document(TEXTS, sentences=TEXTS)


def test_encode_takes_task(sparse):  # type: ignore[no-untyped-def]
    ours, theirs = sparse
    plain = ours.encode(TEXTS)
    for task in ("query", "document", None):
        got = ours.encode(TEXTS, task=task)
        same_rows(got, theirs.encode(TEXTS, task=task))
        assert torch.equal(got.to_dense(), plain.to_dense())  # no Router: the same rows
    with pytest.raises(ValueError, match=r"task 'passage' is not supported; use one of 'query', "
                       r"'document' or None"):  # fmt: skip
        ours.encode(TEXTS, task="passage")


def test_text_pairs_as_sentence_transformers_tokenizes_them(sparse):  # type: ignore[no-untyped-def]
    ours, theirs = sparse
    array = np.array(PAIRS)
    got = ours.encode(array, convert_to_tensor=True, save_to_cpu=True)
    assert got.shape == (3, ours.vocab_size)
    same_rows(got, theirs.encode(array, convert_to_tensor=True, save_to_cpu=True))
    assert torch.equal(got.to_dense(), ours.encode(array.tolist()).to_dense())
    same_rows(ours.encode([tuple(p) for p in PAIRS]), theirs.encode([tuple(p) for p in PAIRS]))
    same_rows(ours.encode(array, prompt="query: "), theirs.encode(array, prompt="query: "))
    same_rows(ours.encode(PAIRS[0:1]), theirs.encode(PAIRS[0:1]))
    # a pair is not its two texts joined: the second text has its own segment
    joined = ours.encode([" ".join(p) for p in PAIRS]).to_dense()
    assert not torch.allclose(got.to_dense(), joined)
    with pytest.raises(TypeError, match=r"sentences\[0\] must be a string or a \[text, pair\]"):
        ours.encode([["one", "two", "three"]])


@pytest.mark.parametrize("limit", [4, 5, 9])
def test_processing_kwargs_set_this_calls_max_length(sparse, limit):  # type: ignore[no-untyped-def]
    ours, theirs = sparse
    settings = {"text": {"max_length": limit, "truncation": True}}
    with pytest.warns(UserWarning, match="truncated"):
        got = ours.encode([LONG], processing_kwargs=settings)
    same_rows(got, theirs.encode([LONG], processing_kwargs=settings))
    assert not torch.allclose(got.to_dense(), ours.encode([LONG]).to_dense())
    pairs = ours.encode(np.array(PAIRS), processing_kwargs=settings)
    same_rows(pairs, theirs.encode(np.array(PAIRS), processing_kwargs=settings))
    # the next call is back at the model's length
    same_rows(ours.encode([LONG]), theirs.encode([LONG]))


def test_processing_kwargs_refused_by_name(sparse):  # type: ignore[no-untyped-def]
    ours, _ = sparse
    with pytest.raises(ValueError, match=r"processing_kwargs\['image'\] is not supported"):
        ours.encode(TEXTS, processing_kwargs={"image": {"size": 3}})
    with pytest.raises(ValueError, match=r"processing_kwargs\['text'\]\['stride'\]=2 is not"):
        ours.encode(TEXTS, processing_kwargs={"text": {"stride": 2}})
    with pytest.raises(ValueError, match=r"max_length'\]=100000 is out of range"):
        ours.encode(TEXTS, processing_kwargs={"text": {"max_length": 100_000}})


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda m: m.decode(m.encode("hello world"), top_k=0), ValueError,
         "top_k must be a positive integer"),
        (lambda m: m.decode(m.encode("hello world"), top_k=-5), ValueError,
         "top_k must be a positive integer"),
        (lambda m: m.decode([1, 2, 3]), TypeError, "Expected torch.Tensor"),
        (lambda m: m.decode(torch.zeros(2, 3, 4)), ValueError, "Input tensor must be 1D or 2D"),
        (lambda m: m.encode(TEXTS, prompt_name="invalid_prompt_name"), ValueError, re.escape(
            "Prompt name 'invalid_prompt_name' not found in the configured prompts dictionary "
            "with keys ['query', 'document']."
        )),
        (lambda m: setattr(m, "similarity_fn_name", "maxsim"), ValueError, "MultiVectorEncoder"),
    ],
)  # fmt: skip
def test_sparse_messages_hold_sentence_transformers_words(prompted, call, error, words):  # type: ignore[no-untyped-def]
    ours, theirs = prompted
    ours.prompts = theirs.prompts = {"query": "", "document": ""}
    for model in (ours, theirs):
        with pytest.raises(error, match=words):
            call(model)


# ---------------------------------------------------------------------- CrossEncoder
@pytest.fixture(scope="module")
def cross(tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    from sentence_transformers import CrossEncoder as STCrossEncoder

    folder = save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr5"), 1, seed=5)
    return CrossEncoder(folder, threads=1), STCrossEncoder(str(folder), device="cpu")


@pytest.mark.parametrize("name", ["convert_to_numpy", "convert_to_tensor", "apply_softmax"])
def test_rank_logs_its_deprecated_keywords(cross, caplog, name):  # type: ignore[no-untyped-def]
    ours, _ = cross
    docs = [d for _, d in PAIRS]
    want = ours.rank(PAIRS[0][0], docs)
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.warns(FutureWarning, match=name):
        got = ours.rank(PAIRS[0][0], docs, **{name: True})
    assert got == want and type(got[0]["score"]) is float
    assert f"CrossEncoder.rank `{name}` argument is deprecated and has no effect" in caplog.text


def test_rank_on_a_multi_label_model_says_what_sentence_transformers_says(
    tiny_checkpoint, tmp_path
):  # type: ignore[no-untyped-def]
    from sentence_transformers import CrossEncoder as STCrossEncoder

    folder = save_classifier(tiny_checkpoint, tmp_path, 3, seed=1)
    words = re.escape(
        "CrossEncoder.rank() only works for models with num_labels=1. Consider using "
        "CrossEncoder.predict() with input pairs instead."
    )
    for model in (CrossEncoder(folder, threads=1), STCrossEncoder(str(folder), device="cpu")):
        with pytest.raises(ValueError, match=words):
            model.rank("a query", ["a document", "another"])


@pytest.mark.parametrize(
    "inputs",
    [
        np.array(["query", "document"]),
        np.array([["q1", "d1"], ["q2", "d2"]]),
        np.array([], dtype=str),
        np.array(["query", "document"], dtype=object),
        ["query", "document"],
        ("query", "document"),
        [["q1", "d1"]],
        [("q1", "d1")],
        [],
        "a text",
    ],
)
def test_is_singular_input_as_sentence_transformers(cross, inputs):  # type: ignore[no-untyped-def]
    ours, theirs = cross
    assert ours.is_singular_input(inputs) is theirs.is_singular_input(inputs)


@pytest.mark.parametrize("limit", [3, 4, 5, 8])
def test_predict_takes_processing_kwargs(cross, limit):  # type: ignore[no-untyped-def]
    ours, theirs = cross
    settings = {"text": {"max_length": limit, "truncation": True}}
    with pytest.warns(UserWarning, match="truncated"):
        got = ours.predict(PAIRS, processing_kwargs=settings)
    np.testing.assert_allclose(got, theirs.predict(PAIRS, processing_kwargs=settings), atol=1e-5)
    assert not np.allclose(got, ours.predict(PAIRS))
    np.testing.assert_allclose(ours.predict(PAIRS), theirs.predict(PAIRS), atol=1e-5)
    with pytest.raises(ValueError, match=r"processing_kwargs\['chat_template'\] is not supported"):
        ours.predict(PAIRS, processing_kwargs={"chat_template": {}})
