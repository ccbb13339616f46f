"""``bertattn.MultiVectorEncoder`` on the ColBERT checkpoints people download, against
sentence-transformers 6's ``MultiVectorEncoder`` on the same folder: a PyLate folder and a
Stanford ColBERT (colbertv2.0-form) folder, each written here in its own format around a tiny
random BERT that transformers builds, and a SentenceTransformer folder converted. Token rows
within 1e-5 for queries (expanded with [MASK] to the query length) and documents (the
punctuation skip-list), as tests/test_multi_vector.py compares."""

from __future__ import annotations

import json
import logging
import shutil
import string
from pathlib import Path

import pytest
import torch
from test_multi_vector import assert_rows_equal

from bertattn import MultiVectorEncoder
from bertattn.errors import ModelFolderError

QUERIES = [
    "hello world",
    "the attention head looks at every token in the sentence and weighs it, then the model",
    "is it ok?",
]
DOCUMENTS = [
    "hello, the model!",
    "the model: a layer, a head; every token.",
    "the first line of text is the second line of text " * 4,  # cut at document_length
]


def _dense_weights(folder: Path, shape: tuple[int, int], seed: int) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {"linear.weight": torch.randn(shape, generator=g) * 0.2}, str(folder / "model.safetensors")
    )


def _write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def pylate_folder(out: Path, tiny: Path, *, seed: int = 1, **config: object) -> Path:
    """A folder as PyLate saves one: the encoder with ``[Q] `` and ``[D] `` added to its
    tokenizer (``add_tokens``, the embeddings resized), ``modules.json`` of a Transformer and
    ``pylate.models.Dense.Dense`` (``1_Dense``: config and ``linear.weight``), and PyLate's
    fields in ``config_sentence_transformers.json`` (``config`` on top of them)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(tiny))
    model = transformers.BertModel.from_pretrained(str(tiny))
    tok.add_tokens(["[Q] ", "[D] "])
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    _write(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ])  # fmt: skip
    _write(out / "sentence_bert_config.json", {"max_seq_length": 127, "do_lower_case": False})
    _write(out / "config_sentence_transformers.json", {
        "__version__": {"sentence_transformers": "3.4.1", "pylate": "1.1.7"},
        "prompts": {},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": 12,
        "document_length": 20,
        "attend_to_expansion_tokens": False,
        "skiplist_words": list(string.punctuation),
        **config,
    })  # fmt: skip
    hidden = model.config.hidden_size
    _dense_weights(out / "1_Dense", (16, hidden), seed)
    _write(out / "1_Dense" / "config.json", {
        "in_features": hidden, "out_features": 16, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
    })  # fmt: skip
    return out


def _pair(folder: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    return MultiVectorEncoder(folder, threads=1), STMultiVectorEncoder(str(folder), device="cpu")


def _same_rows(ours: MultiVectorEncoder, st) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    q, q_st = ours.encode_query(QUERIES), st.encode_query(QUERIES)
    assert_rows_equal(q, q_st)
    d, d_st = ours.encode_document(DOCUMENTS), st.encode_document(DOCUMENTS)
    assert_rows_equal(d, d_st)
    torch.testing.assert_close(ours.similarity(q, d), st.similarity(q_st, d_st), atol=1e-4, rtol=0)
    return q, d


@pytest.fixture(scope="module")
def pylate(tiny_checkpoint, tmp_path_factory) -> Path:
    return pylate_folder(tmp_path_factory.mktemp("pylate") / "m", tiny_checkpoint)


def test_pylate_folder_equals_sentence_transformers(pylate, mkl_products):
    ours, st = _pair(pylate)
    assert ours.settings.form == "pylate"
    assert ours.prompts == {"query": "[Q] ", "document": "[D] "}
    q, d = _same_rows(ours, st)
    assert [len(r) for r in q] == [12, 12, 12]  # every query expanded (or cut) to 12 tokens
    tokens, kept = ours.scored_tokens("hello world", "query")
    assert tokens[:3] == ["[CLS]", "[Q] ", "hello"] and tokens[-1] == "[MASK]" and all(kept)
    # a document: [CLS] [D] hello , the model ! [SEP]: the punctuation has no row
    tokens, kept = ours.scored_tokens(DOCUMENTS[0], "document")
    assert len(d[0]) == sum(kept) == len(tokens) - 2 == 6
    assert len(d[2]) <= 20  # cut at document_length


def test_expanded_tokens_are_computed_not_attended(pylate):
    """attend_to_expansion_tokens false: a query's real rows are those of the query alone, its
    [MASK] rows are not zero (they are computed, only no token looks at them)."""
    ours, _ = _pair(pylate)
    row = ours.encode_query("hello world")
    real = len(ours.bert.tokenizer.encode_batch(["[Q] hello world"])[0].ids)
    alone = ours.encode(["[Q] hello world"], normalize_embeddings=True)[0]  # no expansion
    torch.testing.assert_close(row[:real], alone, atol=1e-5, rtol=0)
    assert bool((row[real:].norm(dim=1) > 0.99).all())


@pytest.mark.parametrize(
    "config",
    [
        {"attend_to_expansion_tokens": True},
        {"do_query_expansion": False, "query_length": 8},  # queries cut at 8, not expanded
        {"model_type": "ColBERT", "skiplist_words": None},  # PyLate 3: punctuation by default
    ],
)
def test_pylate_variants_equal_sentence_transformers(
    tiny_checkpoint, tmp_path, config, mkl_products
):
    folder = pylate_folder(tmp_path / "m", tiny_checkpoint, seed=2, **config)
    ours, st = _pair(folder)
    q, _ = _same_rows(ours, st)
    if config.get("do_query_expansion") is False:
        assert max(len(r) for r in q) == 8 and min(len(r) for r in q) < 8


def test_a_saved_pylate_model_loads_alike(pylate, tmp_path, mkl_products):
    """save() of a PyLate model given a prompt: both libraries read the folder back alike."""
    MultiVectorEncoder(pylate, prompts={"topic": "about: "}).save(tmp_path / "saved")
    ours, st = _pair(tmp_path / "saved")
    assert ours.prompts == st.prompts and ours.prompts["topic"] == "about: "
    assert ours.settings.form == "pylate"
    _same_rows(ours, st)


def test_pylate_dense_with_residual_is_refused(pylate, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(pylate, copy)
    cfg = json.loads((copy / "1_Dense" / "config.json").read_text())
    _write(copy / "1_Dense" / "config.json", {**cfg, "use_residual": True})
    with pytest.raises(ModelFolderError, match=r"use_residual true is not supported"):
        MultiVectorEncoder(copy)


def test_the_server_answers_a_pylate_folder_as_encode_query(pylate):
    """/embed_multi_vector and /rerank on a PyLate model: queries expanded and cut at the
    expansion's length, as encode_query gives them."""
    import numpy as np
    from test_serve_multi import ask

    from bertattn.serve import create_app

    model = MultiVectorEncoder(pylate, threads=1)
    r = ask(create_app([model], max_batch_tokens=1024), [
        ("/embed_multi_vector", {"inputs": QUERIES, "task": "query"}),
        ("/embed_multi_vector", {"inputs": DOCUMENTS, "task": "document"}),
    ])  # fmt: skip
    assert [x.status_code for x in r] == [200, 200], [x.text for x in r]
    for got, want in zip(r[0].json() + r[1].json(), model.encode_query(QUERIES) +
                         model.encode_document(DOCUMENTS), strict=True):  # fmt: skip
        np.testing.assert_allclose(np.array(got, np.float32), want.numpy(), atol=1e-4)


def test_auto_detection_names_a_pylate_folder(pylate):
    from bertattn.heads.auto import is_multi_vector_folder, resolve_auto

    assert is_multi_vector_folder(pylate)
    assert resolve_auto(pylate)[1] == "multi-vector"


def stanford_folder(out: Path, *, seed: int = 3, metadata: dict | None = None) -> Path:
    """A folder as Stanford ColBERT saves one (colbertv2.0's form): a Hugging Face BERT folder
    whose ``config.json`` names ``HF_ColBERT``, its tensors under ``bert.`` with the projection
    ``linear.weight`` beside them, and ``artifact.metadata``. The vocabulary (101 entries) holds
    ``[unused0]`` and ``[unused1]``, the markers."""
    from safetensors.torch import load_file, save_file
    from tiny_bert import save_tiny_checkpoint

    save_tiny_checkpoint(out, seed, vocab_size=101)
    tensors = {f"bert.{k}": v for k, v in load_file(str(out / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(seed + 1)
    tensors["linear.weight"] = torch.randn(16, 32, generator=g) * 0.2
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    _write(out / "config.json", {**config, "architectures": ["HF_ColBERT"]})
    if metadata is not None:
        _write(out / "artifact.metadata", {
            "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 12,
            "doc_maxlen": 20, "mask_punctuation": True, "dim": 16, "similarity": "cosine",
            "attend_to_mask_tokens": False, "nbits": 2, "kmeans_niters": 4, **metadata,
        })  # fmt: skip
    return out


@pytest.mark.parametrize(
    "metadata",
    [{}, {"attend_to_mask_tokens": True, "mask_punctuation": False, "query_maxlen": 16}, None],
    ids=["colbertv2", "attend-no-punctuation", "no-metadata"],
)
def test_stanford_folder_equals_sentence_transformers(tmp_path, metadata, mkl_products):
    folder = stanford_folder(tmp_path / "m", metadata=metadata)
    ours, st = _pair(folder)
    assert ours.settings.form == "stanford"
    assert ours.prompts == {"query": "[unused0] ", "document": "[unused1] "}
    q, d = _same_rows(ours, st)
    length = 32 if metadata is None else metadata.get("query_maxlen", 12)
    assert [len(r) for r in q] == [min(length, 32)] * 3
    tokens, _ = ours.scored_tokens("hello world", "query")
    assert tokens[:3] == ["[CLS]", "[unused0]", "hello"]  # the marker is one token
    tokens, kept = ours.scored_tokens(DOCUMENTS[0], "document")
    skipped = 0 if metadata and metadata.get("mask_punctuation") is False else 2
    assert len(d[0]) == sum(kept) == len(tokens) - skipped


def test_a_saved_stanford_model_loads_alike(tmp_path, mkl_products):
    """save() of a Stanford model writes a folder both libraries load alike: still Stanford's
    (no modules.json), its markers the prompts (sentence-transformers reads no saved prompts
    for such a folder, so neither does bertattn)."""
    folder = stanford_folder(tmp_path / "m", metadata={})
    MultiVectorEncoder(folder, prompts={"topic": "about: "}).save(tmp_path / "saved")
    ours, st = _pair(tmp_path / "saved")
    assert ours.prompts == st.prompts == {"query": "[unused0] ", "document": "[unused1] "}
    assert ours.settings.form == "stanford"
    _same_rows(ours, st)


def test_stanford_folder_without_its_projection_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = stanford_folder(tmp_path / "m", metadata={})
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["linear.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelFolderError, match=r"names HF_ColBERT .* hold no 'linear.weight'"):
        MultiVectorEncoder(folder)


def test_auto_detection_names_a_stanford_folder(tmp_path):
    from bertattn.heads.auto import resolve_auto

    assert resolve_auto(stanford_folder(tmp_path / "m", metadata={}))[1] == "multi-vector"


def sentence_transformer_folder(out: Path, tiny: Path, *, dense: bool = True) -> Path:
    """A SentenceTransformer folder saved by sentence-transformers: the tiny encoder, mean
    Pooling, a seeded Dense (32 -> 16, tanh) when ``dense``, Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    modules: list = [Transformer(str(tiny)), Pooling(32, "mean")]
    if dense:
        layer = Dense(32, 16)  # sentence-level, tanh: sentence-transformers' defaults
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for param in layer.parameters():
                param.copy_(torch.randn(param.shape, generator=g) * 0.2)
        modules.append(layer)
    SentenceTransformer(modules=[*modules, Normalize()], device="cpu").save(str(out))
    return out


def test_sentence_transformer_folder_is_converted_as_upstream(tiny_checkpoint, tmp_path):
    """Pooling and the sentence Normalize dropped, the Dense (tanh) run on each token, then a
    MultiVectorMask and a token Normalize: sentence-transformers' conversion."""
    folder = sentence_transformer_folder(tmp_path / "m", tiny_checkpoint)
    ours, st = _pair(folder)
    assert ours.settings.form == "converted" and ours.get_embedding_dimension() == 16
    assert ours.prompts == st.prompts
    q, d = _same_rows(ours, st)
    assert [len(r) for r in d] == [len(ours.scored_tokens(t, "document")[0]) for t in DOCUMENTS]


def test_sentence_transformer_folder_without_dense_is_refused(tiny_checkpoint, tmp_path):
    """sentence-transformers appends a randomly initialised (hidden, 128) projection to such a
    folder: rows that mean nothing (two loads disagree), so bertattn refuses it by name."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    folder = sentence_transformer_folder(tmp_path / "m", tiny_checkpoint, dense=False)
    first, second = (STMultiVectorEncoder(str(folder), device="cpu") for _ in range(2))
    a, b = first.encode_document(DOCUMENTS[:1])[0], second.encode_document(DOCUMENTS[:1])[0]
    assert a.shape[1] == 128 and not torch.allclose(a, b)
    with pytest.raises(ModelFolderError, match=r"without a Dense projection; .* randomly "):
        MultiVectorEncoder(folder)


@pytest.mark.parametrize(
    ("prompts", "default"),
    [
        ({"query": "search: ", "topic": "about: "}, "topic"),
        (None, "document"),
        ({"query": ""}, None),
    ],
)
def test_prompts_given_to_the_constructor_as_upstream(pylate, prompts, default, mkl_products):
    """prompts= / default_prompt_name= over a PyLate folder's markers, as sentence-transformers
    merges them: yours win, the folder's fill the rest; the default applies to encode()."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    kwargs = {"prompts": prompts, "default_prompt_name": default}
    ours = MultiVectorEncoder(pylate, threads=1, **kwargs)
    st = STMultiVectorEncoder(str(pylate), device="cpu", **kwargs)
    assert ours.prompts == st.prompts and ours.default_prompt_name == st.default_prompt_name
    _same_rows(ours, st)
    assert_rows_equal(ours.encode(DOCUMENTS), st.encode(DOCUMENTS))


def test_bad_prompts_are_refused(pylate):
    with pytest.raises(TypeError, match=r"prompts must be a dict of names to prompt texts, .*got"):
        MultiVectorEncoder(pylate, prompts={"query": 1})
    with pytest.raises(TypeError, match=r"default_prompt_name must be a str .* got 3 \(an int\)"):
        MultiVectorEncoder(pylate, default_prompt_name=3)
    with pytest.raises(ValueError, match=r"default_prompt_name 'nope' is not among the prompts"):
        MultiVectorEncoder(pylate, default_prompt_name="nope")


# keep the loggers quiet about the tiny tokenizer's skip-list words it lacks
@pytest.fixture(autouse=True)
def _quiet(caplog):  # type: ignore[no-untyped-def]
    caplog.set_level(logging.ERROR, "bertattn.heads")
