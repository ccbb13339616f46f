"""``.config``, ``.tokenizer`` and ``.model`` on ``CrossEncoder``, ``SparseEncoder`` and
``MultiVectorEncoder`` (issue 58): the config read as transformers reads it from the same
folder (``id2label`` with int keys, ``label2id``, ``num_labels``, ``model_type``, sizes), read
only; the tokenizer and encoder module the model already holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_heads_cross_encoder import save_classifier
from test_multi_vector import build

from bertattn import CrossEncoder, MultiVectorEncoder, SparseEncoder

LABELS = {0: "contradiction", 1: "entailment", 2: "neutral"}


@pytest.fixture(scope="module")
def nli(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_classifier(
        tiny_checkpoint, tmp_path_factory.mktemp("views_nli"), 3, seed=4, id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )  # fmt: skip


@pytest.fixture(scope="module")
def unnamed(tiny_checkpoint, tmp_path_factory) -> Path:
    """A two-label classifier whose config.json names no labels (transformers' LABEL_i)."""
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("views_two"), 2, seed=6)


def test_cross_encoder_config_as_transformers_reads_it(nli):
    import transformers

    want = transformers.AutoConfig.from_pretrained(nli)
    config = CrossEncoder(nli, threads=1).config
    assert config.id2label == want.id2label == LABELS
    assert config.label2id == want.label2id
    assert config.num_labels == want.num_labels == 3
    for name in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "vocab_size", "max_position_embeddings", "architectures"):  # fmt: skip
        assert config[name] == getattr(want, name), name
        assert getattr(config, name) == getattr(want, name), name
    copied = config.to_dict()
    assert copied["id2label"] == want.to_dict()["id2label"] == LABELS
    copied["id2label"][0] = "changed"
    assert config.id2label[0] == "contradiction"


def test_labels_a_folder_does_not_name_are_transformers_names(unnamed):
    import transformers

    want = transformers.AutoConfig.from_pretrained(unnamed).id2label
    config = CrossEncoder(unnamed, threads=1).config
    assert config.id2label == want == {0: "LABEL_0", 1: "LABEL_1"}
    assert config.num_labels == 2


def test_the_config_is_read_only_and_names_what_it_has(nli):
    config = CrossEncoder(nli, threads=1).config
    with pytest.raises(AttributeError, match="model.config is read-only .*'num_labels'"):
        config.num_labels = 5  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no field 'nope'; it has .*hidden_size"):
        _ = config.nope
    assert config.num_labels == 3


def test_tokenizer_and_model_are_the_ones_held(nli, splade_dir, tiny_checkpoint, tmp_path):
    mv_folder = build(tiny_checkpoint, tmp_path / "mv", width=16)
    for model in (
        CrossEncoder(nli, threads=1),
        SparseEncoder(splade_dir, threads=1),
        MultiVectorEncoder(mv_folder, threads=1),
    ):
        assert model.tokenizer is model.bert.tokenizer
        assert model.model is model.bert.model
        assert isinstance(model.model, torch.nn.Module)
        ids = model.tokenizer(["a text"]).input_ids
        assert model.tokenizer.decode(ids[0].tolist()) == "a text"
        assert model.config.model_type == "bert"
        assert model.config.hidden_size == model.model.config.hidden_size
