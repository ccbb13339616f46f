"""Sequence classifiers of BERT's family whose head is not BERT's pooler + classifier:
DistilBERT's (``pre_classifier`` + ReLU on the first token, then ``classifier``; the kind of
the text-classification pipeline's default sentiment model) and ELECTRA's (``classifier.dense``
+ GELU, then ``out_proj``; the kind of ELECTRA cross-encoders). Random weights with a fixed
seed saved by transformers: ``CrossEncoder`` logits on texts and pairs within 1e-5 of
transformers' ``*ForSequenceClassification``, the text-classification pipeline's answers equal
transformers', and a head missing a tensor is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_heads_pipelines import same
from tiny_bert import TINY, save_random

import bertattn
from bertattn import CrossEncoder
from bertattn.errors import ModelFolderError

TEXTS = ["the attention head looks at every token", "hello", "bert model layer and a word ok"]
PAIRS = [(TEXTS[0], "every token"), (TEXTS[1], TEXTS[2]), ("a word", "ok")]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _save(family: str, base: Path, out: Path) -> Path:
    """A random ``*ForSequenceClassification`` of ``family`` with three named labels."""
    import transformers

    labels = {"id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}}
    sizes = {
        "vocab_size": TINY["vocab_size"],
        "max_position_embeddings": TINY["max_position_embeddings"],
    }
    if family == "distilbert":
        config = transformers.DistilBertConfig(
            dim=TINY["hidden_size"],
            n_layers=TINY["num_hidden_layers"],
            n_heads=TINY["num_attention_heads"],
            hidden_dim=TINY["intermediate_size"],
            **sizes,
            **labels,
        )
        cls = transformers.DistilBertForSequenceClassification
    else:
        config = transformers.ElectraConfig(embedding_size=TINY["hidden_size"], **TINY, **labels)
        cls = transformers.ElectraForSequenceClassification
    save_random(cls, config, out, seed=5, tokenizer_from=base)
    return out


@pytest.fixture(scope="module", params=["distilbert", "electra"])
def classifier(request, tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    return request.param, _save(request.param, tiny_checkpoint, tmp_path_factory.mktemp("c"))


def test_logits_equal_transformers(classifier):
    import transformers

    family, folder = classifier
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(theirs).__name__.lower().startswith(family)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ours = CrossEncoder(folder, threads=1)
    for inputs in (TEXTS, PAIRS):
        firsts = [x if isinstance(x, str) else x[0] for x in inputs]
        seconds = None if isinstance(inputs[0], str) else [x[1] for x in inputs]
        batch = tok(firsts, seconds, padding=True, return_tensors="pt")
        batch.pop("token_type_ids", None) if family == "distilbert" else None
        with torch.no_grad():
            want = theirs(**batch).logits
        got = ours.logits(inputs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert got.abs().max() > 1e-2  # the head did something


def test_text_classification_pipeline_like_transformers(classifier):
    from transformers import pipeline as hf_pipeline

    _, folder = classifier
    ours = bertattn.pipeline("text-classification", folder)
    theirs = hf_pipeline("text-classification", str(folder))
    same(ours(TEXTS), theirs(TEXTS))
    same(ours(TEXTS, top_k=None), theirs(TEXTS, top_k=None))


def test_a_missing_head_tensor_is_named(classifier, tmp_path):
    import shutil

    family, folder = classifier
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    weights = broken / "model.safetensors"
    state = load_file(weights)
    name = "pre_classifier.bias" if family == "distilbert" else "classifier.dense.bias"
    del state[name]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match=f"missing {name}"):
        CrossEncoder(broken, threads=1)


def test_a_classifier_survives_deepcopy_and_pickle(classifier):
    """Its own first-token head and its activation (identity for three labels) copy too."""
    import copy
    import pickle

    _, folder = classifier
    ce = CrossEncoder(folder, threads=1)
    want = ce.predict(PAIRS)
    for other in (copy.deepcopy(ce), pickle.loads(pickle.dumps(ce))):
        assert other.first_token is not None
        torch.testing.assert_close(torch.as_tensor(other.predict(PAIRS)), torch.as_tensor(want))
