"""bertattn inside sentence-transformers (bertattn.integrations.sentence_transformers), checked
against the stock ``SentenceTransformer`` on the real all-MiniLM-L6-v2 folder."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

st = pytest.importorskip("sentence_transformers")

from bertattn.integrations.sentence_transformers import (  # noqa: E402
    BertattnTransformer,
    bertattn_sentence_transformer,
)

try:  # sentence-transformers >= 6
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling
except ImportError:  # older releases
    from sentence_transformers.models import Normalize, Pooling

pytestmark = pytest.mark.slow

TEXTS = [
    "A man is eating food.",
    "The attention mask keeps every padding token out of the softmax.",
    "Hi",
    "A sentence of middling length, with a comma.",
    "",
    "Über naïve café: accents and punctuation!",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
    "Short one",
    "x " * 300,  # longer than max_seq_length=256: truncated by both
]


def encode(model, texts, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bertattn reports truncation; ST does not
        return model.encode(texts, convert_to_numpy=True, **kwargs)


@pytest.fixture(scope="module")
def stock(minilm_dir):
    return st.SentenceTransformer(str(minilm_dir))


@pytest.fixture(scope="module")
def ours(minilm_dir):
    return bertattn_sentence_transformer(minilm_dir)


def test_helper_builds_the_folders_pipeline(ours, stock):
    assert isinstance(ours[0], BertattnTransformer)
    assert isinstance(ours[1], Pooling) and ours[1].get_config_dict()["pooling_mode"] == "mean"
    assert isinstance(ours[2], Normalize) and len(ours) == 3
    assert ours.max_seq_length == stock.max_seq_length == 256
    assert ours.get_embedding_dimension() == stock.get_embedding_dimension() == 384


@pytest.mark.parametrize("batch_size", [4, 32])
def test_encode_equals_stock(ours, stock, batch_size):
    """batch_size=4: several padded batches; 32: one batch holding every length."""
    a = encode(ours, TEXTS, batch_size=batch_size)
    b = encode(stock, TEXTS, batch_size=batch_size)
    assert a.shape == b.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)  # Normalize ran


def test_encode_with_normalize_embeddings_prompt_and_pairs(ours, stock):
    for kwargs in ({"normalize_embeddings": True}, {"prompt": "query: "}):
        a = encode(ours, TEXTS, batch_size=4, **kwargs)
        b = encode(stock, TEXTS, batch_size=4, **kwargs)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    pairs = [("what is attention?", "a weighted sum of values"), ("hi", "a longer second text")]
    np.testing.assert_allclose(encode(ours, pairs), encode(stock, pairs), rtol=0, atol=1e-5)


def test_token_embeddings_equal_stock(ours, stock):
    a = encode(ours, TEXTS[:4], output_value="token_embeddings", batch_size=4)
    b = encode(stock, TEXTS[:4], output_value="token_embeddings", batch_size=4)
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


def test_modules_built_by_hand(minilm_dir, stock):
    model = st.SentenceTransformer(
        modules=[BertattnTransformer(minilm_dir), Pooling(384, pooling_mode="mean"), Normalize()]
    )
    np.testing.assert_allclose(
        encode(model, TEXTS, batch_size=4), encode(stock, TEXTS, batch_size=4), rtol=0, atol=1e-5
    )
    # cls pooling, no Normalize: a different pipeline, still equal to the same stock pipeline
    first = BertattnTransformer(minilm_dir, attention_backend="sdpa")
    ref = st.SentenceTransformer(modules=[stock[0], Pooling(384, pooling_mode="cls")])
    mine = st.SentenceTransformer(modules=[first, Pooling(384, pooling_mode="cls")])
    np.testing.assert_allclose(encode(mine, TEXTS), encode(ref, TEXTS), rtol=0, atol=1e-5)


def test_max_seq_length_is_honoured(minilm_dir, stock):
    model = bertattn_sentence_transformer(minilm_dir)
    model.max_seq_length = 8
    try:
        stock.max_seq_length = 8
        a = encode(model, TEXTS, batch_size=4)
        b = encode(stock, TEXTS, batch_size=4)
    finally:
        stock.max_seq_length = 256
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    with pytest.warns(UserWarning, match="truncated"):  # bertattn reports truncation
        features = model.preprocess(TEXTS)
    assert features["input_ids"].shape[1] == 8


def test_save_and_load_back(ours, stock, minilm_dir, tmp_path):
    ours.save(str(tmp_path))
    # the module's own files are a plain Hugging Face BERT folder
    import transformers

    hf = transformers.BertModel.from_pretrained(tmp_path)
    reference = transformers.BertModel.from_pretrained(minilm_dir)
    expected = reference.state_dict()
    got = hf.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)
    # sentence-transformers loads it back with this module (a non-ST class: trust_remote_code)
    back = st.SentenceTransformer(str(tmp_path), trust_remote_code=True)
    assert isinstance(back[0], BertattnTransformer)
    np.testing.assert_allclose(
        encode(back, TEXTS, batch_size=4), encode(stock, TEXTS, batch_size=4), rtol=0, atol=1e-5
    )


@pytest.fixture(scope="module")
def saved(ours, tmp_path_factory):
    """A folder written by ``bertattn_sentence_transformer(...).save``: modules.json names
    bertattn's module and sentence-transformers 6's Pooling / Normalize class paths."""
    folder = tmp_path_factory.mktemp("saved")
    ours.save(str(folder))
    return folder


def test_saved_folder_loads_in_bert(saved, stock):
    """It used to be refused ("module type 'bertattn.integrations...' is not supported")."""
    from bertattn import Bert

    bert = Bert.load(saved)
    assert (bert.pooling, bert.normalize, bert.max_length) == ("mean", True, 256)
    np.testing.assert_allclose(encode(bert, TEXTS), encode(stock, TEXTS), rtol=0, atol=1e-5)


def test_folder_saved_by_stock_sentence_transformers_loads_in_bert(stock, tmp_path):
    """sentence-transformers >= 6 writes class paths (``...base.modules.transformer.
    Transformer``) into modules.json, not the ``sentence_transformers.models.*`` names."""
    from bertattn import Bert

    stock.save(str(tmp_path))
    bert = Bert.load(tmp_path)
    assert (bert.pooling, bert.normalize, bert.max_length) == ("mean", True, 256)
    np.testing.assert_allclose(encode(bert, TEXTS), encode(stock, TEXTS), rtol=0, atol=1e-5)


def test_saved_folder_loads_in_the_adapter(saved, stock):
    again = bertattn_sentence_transformer(saved)
    assert isinstance(again[0], BertattnTransformer) and len(again) == 3
    np.testing.assert_allclose(
        encode(again, TEXTS, batch_size=4), encode(stock, TEXTS, batch_size=4), rtol=0, atol=1e-5
    )
    module = BertattnTransformer(saved)
    assert module.max_seq_length == 256


def test_saved_folder_encodes_from_the_command_line(saved, stock, tmp_path, cli):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS[:4]) + "\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    proc = cli("encode", src, "-o", out, "--model", saved)
    assert proc.code == 0, proc
    np.testing.assert_allclose(np.load(out), encode(stock, TEXTS[:4]), rtol=0, atol=1e-5)


def test_forward_trains(minilm_dir):
    model = st.SentenceTransformer(
        modules=[BertattnTransformer(minilm_dir), Pooling(384, pooling_mode="mean")]
    )
    model.train()
    features = model.preprocess(TEXTS[:4])
    emb = model(features)["sentence_embedding"]
    emb.square().sum().backward()
    grad = model[0].model.encoder.layers[0].attn.q_linear.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_processing_kwargs_are_honoured(ours, stock):
    """They used to be ignored silently: every text kept 256 tokens."""
    per_call = {"text": {"max_length": 8}}
    a = encode(ours, TEXTS, batch_size=4, processing_kwargs=per_call)
    b = encode(stock, TEXTS, batch_size=4, processing_kwargs=per_call)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert np.abs(a - encode(ours, TEXTS, batch_size=4)).max() > 0.05  # it changed something
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        features = ours.preprocess(TEXTS, processing_kwargs=per_call)
    assert features["input_ids"].shape[1] == 8


def test_processing_kwargs_it_cannot_honour_are_refused(ours):
    from bertattn.encoder.st_compat import UnsupportedArgumentError

    with pytest.raises(UnsupportedArgumentError, match=r"\['text'\]\['padding'\]='max_length'"):
        ours.encode(["hi"], processing_kwargs={"text": {"padding": "max_length"}})
    with pytest.raises(UnsupportedArgumentError, match=r"processing_kwargs\['image'\]"):
        ours.encode(["hi"], processing_kwargs={"image": {"size": 8}})


def test_output_value_none_has_the_stock_keys(ours, stock):
    """sentence-transformers 6's Transformer adds a 'modality' entry; the adapter did not."""
    for kwargs in ({}, {"prompt": "query: "}):
        a = ours.encode(TEXTS[:3], output_value=None, **kwargs)
        b = stock.encode(TEXTS[:3], output_value=None, **kwargs)
        for x, y in zip(a, b, strict=True):
            assert list(x) == list(y)
            assert x["modality"] == y["modality"]
            assert torch.equal(x["input_ids"], y["input_ids"])
            torch.testing.assert_close(
                x["sentence_embedding"], y["sentence_embedding"], rtol=0, atol=1e-5
            )


def test_refuses_other_inputs(ours):
    with pytest.raises(ValueError, match="text pairs"):
        ours[0].preprocess([{"image": 1}])
    with pytest.raises(ValueError, match="single text in a list"):
        ours[0].preprocess("just a string")
