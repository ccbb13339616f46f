"""The heads of DeBERTa-v3 and Qwen3 checkpoints, random weights with a fixed seed saved by
transformers: a ``DebertaV2ForSequenceClassification`` (the ContextPooler, dense + GELU on the
first token, then the classifier) and a ``Qwen3ForSequenceClassification`` (the score layer,
no bias, on the last real token) as ``bertattn.CrossEncoder`` (logits within 1e-5 of
transformers', scores within 1e-5 of sentence-transformers' ``CrossEncoder``), and a
``DebertaV2ForTokenClassification`` as the tagger (the token-classification pipeline's answers
equal transformers')."""

from __future__ import annotations

from pathlib import Path

import pytest
from family_helpers import (
    assert_reranker_equals_peers,
    assert_tagger_equals_pipeline,
    save_with_seeded_head,
)
from test_family_deberta_v2 import SIZES as DEBERTA
from test_family_deberta_v2 import save_tokenizer
from test_family_qwen3 import SIZES as QWEN3
from tiny_bert import save_random

from bertattn import CrossEncoder
from bertattn.errors import ModelFolderError

PAIRS = [("the attention head looks at every token", "every token"), ("hello", "a model, ok"),
         ("a layer", "the head looks at a token and a model")]  # fmt: skip
LABELS = {0: "O", 1: "B-X", 2: "I-X"}


@pytest.fixture(scope="module")
def deberta_tokenizer(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("deberta_tok")
    save_tokenizer(folder)
    return folder


def test_a_deberta_v3_classifier_is_a_cross_encoder(deberta_tokenizer, tmp_path: Path) -> None:
    import transformers

    config = transformers.DebertaV2Config(**DEBERTA, num_labels=1)
    model = save_random(transformers.DebertaV2ForSequenceClassification, config, tmp_path / "m", 5)
    assert_reranker_equals_peers(model, deberta_tokenizer, 5, PAIRS, tmp_path)


def test_a_deberta_classifier_missing_its_pooler_is_named(deberta_tokenizer, tmp_path) -> None:
    import transformers
    from safetensors.torch import load_file, save_file

    config = transformers.DebertaV2Config(**DEBERTA, num_labels=2)
    save_random(transformers.DebertaV2ForSequenceClassification, config, tmp_path, 2)
    save_tokenizer(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["pooler.dense.bias"]
    save_file(state, tmp_path / "model.safetensors")
    message = (
        r"does not hold the sequence-classification head \(2 labels\) config.json describes: "
        r"missing pooler.dense.bias"
    )
    with pytest.raises(ModelFolderError, match=message):
        CrossEncoder(tmp_path)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_a_qwen3_classifier_is_a_cross_encoder(tiny_checkpoint, tmp_path: Path, padding) -> None:
    """The score layer reads the last real token, wherever the padding is (transformers'
    tokenizer pads on the side its config says; bertattn's pads on the right)."""
    import json

    import transformers

    config = transformers.Qwen3Config(**QWEN3, num_labels=1)
    model = save_random(transformers.Qwen3ForSequenceClassification, config, tmp_path / "m", 4)
    assert model.score.bias is None
    source = tmp_path / "tok"
    source.mkdir()
    (source / "tokenizer.json").write_bytes((tiny_checkpoint / "tokenizer.json").read_bytes())
    settings = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
    settings["padding_side"] = padding
    (source / "tokenizer_config.json").write_text(json.dumps(settings))
    assert_reranker_equals_peers(model, source, 4, PAIRS, tmp_path, head="score")


def test_a_deberta_v3_tagger_equals_transformers_pipeline(deberta_tokenizer, tmp_path) -> None:
    import transformers

    config = transformers.DebertaV2Config(**DEBERTA, num_labels=3, id2label=LABELS,
                                          label2id={v: k for k, v in LABELS.items()})  # fmt: skip
    model = save_random(transformers.DebertaV2ForTokenClassification, config, tmp_path / "t", 6)
    save_with_seeded_head(model, tmp_path / "t", 2)  # a classifier that tags something
    save_tokenizer(tmp_path / "t")
    texts = ["the attention head looks at every token", "hello model, a layer ok"]
    assert_tagger_equals_pipeline(tmp_path / "t", texts, keys=("entity", "word", "start", "end"))


def _kind(folder: Path, architecture: str) -> str | None:
    """The head kind read from a config.json naming ``architecture``."""
    import json

    from bertattn.heads.config import read_head_config

    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return read_head_config(folder).kind


def test_a_records_task_classes_name_the_head_kind(monkeypatch, tmp_path: Path) -> None:
    """Which ``architectures`` class is which head kind is each family record's
    (``head_classes``): a record registered from here makes its classes classifiers."""
    import dataclasses

    from bertattn.families import registry

    assert _kind(tmp_path, "DebertaV2ForTokenClassification") == "token-classification"
    assert _kind(tmp_path, "Qwen3ForSequenceClassification") == "sequence-classification"
    assert _kind(tmp_path, "ToyForSequenceClassification") is None
    monkeypatch.setattr(registry, "_REGISTRY", {**registry._REGISTRY})  # undone after
    classes = registry.task_classes("Toy", *registry.CLASSIFIERS)
    registry.register(dataclasses.replace(registry.get("bert"), name="toy", head_classes=classes))
    assert _kind(tmp_path, "ToyForSequenceClassification") == "sequence-classification"
    assert _kind(tmp_path, "ToyForTokenClassification") == "token-classification"
    message = (
        r"unknown head kinds \['sparse'\]; valid ones: sequence-classification, "
        r"token-classification, masked-lm"
    )
    with pytest.raises(ValueError, match=message):
        registry.task_classes("Toy", "sparse")
