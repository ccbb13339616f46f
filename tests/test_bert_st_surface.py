"""``Bert`` as a drop-in ``SentenceTransformer``: the signatures of the methods both have,
compared programmatically against the installed sentence-transformers with every deliberate
difference read from ONE table (``bertattn.encoder.st_surface.DIFFERENCES``, also shown in
docs/python-api.md); then each call run on both against the real all-MiniLM-L6-v2, outputs
compared."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import Bert
from bertattn.encoder.pipeline import UnsupportedArgumentError
from bertattn.encoder.st_surface import DIFFERENCES, differences_markdown

ATOL = 1e-5  # Bert vs SentenceTransformer, as in test_bert_st_compat.py
METHODS = (
    "encode",
    "encode_query",
    "encode_document",
    "similarity",
    "similarity_pairwise",
    "truncate_embeddings",
    "get_max_seq_length",
    "get_sentence_embedding_dimension",
)
TEXTS = [
    "A man is playing a guitar.",
    "Hi",
    "The new movie is awesome!",
    "",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "x " * 300,  # truncated by both
]
PAIRS = [
    ("what is attention?", "a weighted sum of values"),
    ("hi", "a longer second text, longer than the first"),
    ("", "an empty first text"),
]

slow = pytest.mark.slow


def _st():
    warnings.filterwarnings("ignore", category=FutureWarning)
    import sentence_transformers

    return sentence_transformers


@pytest.fixture(scope="module")
def pair(minilm_dir):
    """(Bert, SentenceTransformer) on the real checkpoint."""
    return Bert.load(minilm_dir), _st().SentenceTransformer(str(minilm_dir), device="cpu")


# ---------------------------------------------------------------------- signatures
def _signature_differences(name: str) -> set[tuple[str, str, str]]:
    """``(method, kind, parameter)`` for each way ``Bert.<name>``'s signature differs from
    ``SentenceTransformer.<name>``'s: a parameter missing or with another default or kind
    ("missing" / "default" / "kind"), or one only Bert has ("added")."""
    theirs = inspect.signature(getattr(_st().SentenceTransformer, name)).parameters
    ours = inspect.signature(getattr(Bert, name)).parameters
    found: set[tuple[str, str, str]] = set()
    for p in theirs.values():
        q = ours.get(p.name)
        if q is None:
            found.add((name, "missing", p.name))
        elif q.default != p.default:
            found.add((name, "default", p.name))
        elif q.kind != p.kind:
            found.add((name, "kind", p.name))
    found |= {(name, "added", n) for n in ours if n not in theirs}
    positional = [n for n, p in theirs.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    mine = [n for n, p in ours.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    if mine[: len(positional)] != positional:
        found.add((name, "order", ",".join(positional)))
    return found


@slow  # importing sentence-transformers takes seconds
def test_signatures_match_but_for_the_table():
    """Every parameter name, default, kind and positional order of sentence-transformers'
    methods is in Bert's; what differs is exactly the table's "added" rows."""
    found = set().union(*(_signature_differences(name) for name in METHODS))
    listed = {(d.method, d.kind, d.what) for d in DIFFERENCES if d.kind != "behaviour"}
    assert found == listed
    assert {d.method for d in DIFFERENCES} <= set(METHODS)
    for name in METHODS:  # the table names no method that is not there
        assert callable(getattr(Bert, name))


def test_the_docs_show_the_table():
    page = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
    section = page.read_text(encoding="utf-8")
    section = section.split("## Inside transformers and sentence-transformers", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    assert differences_markdown() in section
    assert len(DIFFERENCES) == len({(d.method, d.what) for d in DIFFERENCES})  # no duplicates


# ---------------------------------------------------------------------- the calls, on both
def _same(ours, theirs, atol=ATOL):
    """Equal types and shapes, values within ``atol``; recursing into lists and dicts."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for k in theirs:
            _same(ours[k], theirs[k], atol)
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            _same(a, b, atol)
    elif isinstance(theirs, (torch.Tensor, np.ndarray)):
        assert type(ours) is type(theirs) and ours.shape == theirs.shape
        assert ours.dtype == theirs.dtype
        a = ours.numpy(force=True) if isinstance(ours, torch.Tensor) else ours
        b = theirs.numpy(force=True) if isinstance(theirs, torch.Tensor) else theirs
        if b.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=0, atol=atol)
        else:
            assert np.array_equal(a, b)
    else:
        assert ours == theirs


CALLS = {
    "encode texts": lambda m: m.encode(TEXTS),
    "encode one text": lambda m: m.encode("Hi there"),
    "encode sentences=": lambda m: m.encode(sentences=TEXTS),
    "encode tensor, normalized, truncated": lambda m: m.encode(
        TEXTS, convert_to_tensor=True, normalize_embeddings=True, truncate_dim=64
    ),
    "encode list of tensors": lambda m: m.encode(TEXTS[:3], convert_to_numpy=False),
    "encode prompt, batch 2": lambda m: m.encode(TEXTS, prompt="query: ", batch_size=2),
    "encode token_embeddings": lambda m: m.encode(TEXTS[:3], output_value="token_embeddings"),
    "encode ubinary": lambda m: m.encode(TEXTS, precision="ubinary"),
    "encode task=": lambda m: m.encode(TEXTS, task="query"),
    "encode processing_kwargs": lambda m: m.encode(
        TEXTS, processing_kwargs={"text": {"max_length": 8}}
    ),
    "encode pairs": lambda m: m.encode(PAIRS),
    "encode pairs as lists": lambda m: m.encode([list(p) for p in PAIRS]),
    "encode pairs, 2-D array": lambda m: m.encode(np.array(PAIRS)),
    "encode pairs, prompt": lambda m: m.encode(PAIRS, prompt="query: "),
    "encode output_value=None": lambda m: m.encode(TEXTS, output_value=None, batch_size=4),
    "encode output_value=None, prompt": lambda m: m.encode(
        TEXTS[:3], output_value=None, prompt="query: "
    ),
    "encode output_value=None, one text": lambda m: m.encode("Hi", output_value=None),
    "encode output_value=None, pairs": lambda m: m.encode(PAIRS, output_value=None),
    "encode_query": lambda m: m.encode_query(TEXTS),
    "encode_query sentences=": lambda m: m.encode_query(sentences=TEXTS, batch_size=2),
    "encode_query prompt": lambda m: m.encode_query(TEXTS, prompt="q: "),
    "encode_document": lambda m: m.encode_document(TEXTS, convert_to_tensor=True),
    "encode_document sentences=": lambda m: m.encode_document(sentences=PAIRS),
    "similarity": lambda m: m.similarity(m.encode(TEXTS[:3]), m.encode(TEXTS)),
    "similarity_pairwise": lambda m: m.similarity_pairwise(m.encode(TEXTS), m.encode(TEXTS[::-1])),
    "truncate_embeddings": lambda m: _truncated(m),
    "get_max_seq_length": lambda m: m.get_max_seq_length(),
    "get_sentence_embedding_dimension": lambda m: m.get_sentence_embedding_dimension(),
    "dtype": lambda m: m.dtype,
}


def _truncated(model):
    with model.truncate_embeddings(32):
        inside = model.encode(TEXTS)
    return [inside, model.encode(TEXTS[:2])]  # (N, 32) inside; the full width after


def _padding_free(rows):
    """output_value=None rows with token_embeddings zeroed at padding: the one deliberate
    difference in those rows (see DIFFERENCES), every other entry compared exactly."""
    if isinstance(rows, dict):
        rows = [rows]
    for row in rows:
        row["token_embeddings"] = row["token_embeddings"] * row["attention_mask"][:, None]
    return rows


@slow
@pytest.mark.parametrize("call", list(CALLS))
def test_call_gives_what_sentence_transformers_gives(pair, call):
    bert, st_model = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bertattn reports truncation; ST does not
        ours, theirs = CALLS[call](bert), CALLS[call](st_model)
    if "output_value=None" in call:
        ours, theirs = _padding_free(ours), _padding_free(theirs)
    _same(ours, theirs)


@slow
def test_pairs_are_cross_encoded(pair):
    bert, _ = pair
    row = bert.encode([PAIRS[0]], output_value=None)[0]
    tokens = bert.tokenizer._tok.decode(row["input_ids"].tolist(), skip_special_tokens=False)
    assert tokens == "[CLS] what is attention? [SEP] a weighted sum of values [SEP]"
    assert row["token_type_ids"].tolist().count(1) == 6  # the second text and its [SEP]
    joined = bert.encode(["what is attention? a weighted sum of values"])
    assert np.abs(bert.encode([PAIRS[0]]) - joined).max() > 1e-3  # not one concatenated text


# ---------------------------------------------------------------------- refusals, fast
def test_pairs_and_processing_kwargs_refused_clearly(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    with pytest.raises(ValueError, match=r"inputs\[1\] is a str; inputs\[0\] is a text pair"):
        bert.encode([("a", "b"), "c"])
    with pytest.raises(ValueError, match=r"inputs\[0\] is a tuple of 3 items"):
        bert.encode([("a", "b", "c")])
    with pytest.raises(ValueError, match=r"shape \(1, 3\).*pass shape \(N, 2\)"):
        bert.encode(np.array([["a", "b", "c"]]))
    with pytest.raises(UnsupportedArgumentError, match=r"processing_kwargs\['image'\]"):
        bert.encode(["hi"], processing_kwargs={"image": {"size": 8}})
    with pytest.raises(UnsupportedArgumentError, match=r"\['text'\]\['padding'\]='max_length'"):
        bert.encode(["hi"], processing_kwargs={"text": {"padding": "max_length"}})
    with pytest.raises(ValueError, match="max_length'\\] must be a positive int, got 0"):
        bert.encode(["hi"], processing_kwargs={"text": {"max_length": 0}})
    with pytest.raises(TypeError, match="processing_kwargs must be a dict"):
        bert.encode(["hi"], processing_kwargs=8)
    texts = ["hello world, a longer text", "hi"]
    np.testing.assert_allclose(
        bert.encode(texts, processing_kwargs={"text": {"max_length": 4, "truncation": True}}),
        bert.encode(texts, max_length=4),
        atol=1e-6,
    )


def test_pairs_on_a_model_with_one_token_type(tiny_checkpoint_factory):
    """Refused by message (it was an IndexError inside the embedding)."""
    from bertattn.errors import ModelFolderError

    bert = Bert.load(tiny_checkpoint_factory(type_vocab_size=1))
    with pytest.raises(ModelFolderError, match=r"type_vocab_size=1.*takes no text pairs"):
        bert.encode([("hello", "world")])
    assert bert.encode(["hello world"]).shape == (1, 32)


def test_encode_query_and_document_set_the_task(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    for method in (bert.encode_query, bert.encode_document):
        with pytest.raises(TypeError, match=r"sets task=.* itself and got task='x'"):
            method(["hi"], task="x")
    assert bert.encode_query(sentences=["hi"], pooling="mean", max_length=4).shape == (1, 32)


def test_truncate_embeddings_restores_and_checks(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint)
    with pytest.raises(RuntimeError, match="inside"), bert.truncate_embeddings(8):
        assert bert.encode(["hi"]).shape == (1, 8) and bert.get_embedding_dimension() == 8
        raise RuntimeError("inside")
    assert bert.truncate_dim is None and bert.encode(["hi"]).shape == (1, 32)
    with pytest.raises(ValueError, match="truncate_dim must be a positive int or None, got 0"):
        with bert.truncate_embeddings(0):
            pass
    assert bert.get_max_seq_length() == bert.max_seq_length
    assert bert.dtype == torch.float32
    assert Bert.load(tiny_checkpoint, dtype="bfloat16").dtype == torch.bfloat16
