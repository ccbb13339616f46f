"""DistilBERT checkpoints in the same encoder: a random ``transformers.DistilBertModel`` (tiny
sizes, every parameter moved by seeded noise) saved with ``save_pretrained`` loads strictly, its
hidden states within 1e-5 of transformers' on texts and padded batches, ``Bert.encode`` equal
to sentence-transformers on the same folder, what is not equivalent refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from family_helpers import assert_encode_equals_sentence_transformers
from tiny_bert import TINY, save_random

from bertattn import Bert, BertModel
from bertattn.errors import ModelFolderError

TEXTS = ["the attention head looks at every token", "hello", "bert model layer and a word ok"]


def save_distilbert(base: Path, out: Path, seed: int = 0, cls: str = "DistilBertModel") -> Path:
    import transformers

    config = transformers.DistilBertConfig(
        vocab_size=TINY["vocab_size"],
        dim=TINY["hidden_size"],
        n_layers=TINY["num_hidden_layers"],
        n_heads=TINY["num_attention_heads"],
        hidden_dim=TINY["intermediate_size"],
        max_position_embeddings=TINY["max_position_embeddings"],
    )
    save_random(getattr(transformers, cls), config, out, seed, tokenizer_from=base)
    return out


@pytest.fixture(scope="module")
def distil(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_distilbert(tiny_checkpoint, tmp_path_factory.mktemp("distil"))


def test_hidden_states_equal_transformers(distil):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(distil)
    theirs = transformers.DistilBertModel.from_pretrained(distil).eval()
    ours = BertModel.from_pretrained(distil)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = theirs(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        got = ours(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_encode_equals_sentence_transformers(distil, tmp_path):
    assert_encode_equals_sentence_transformers(distil, TINY["hidden_size"], TEXTS, tmp_path)


def test_a_distilbert_classifier_folder_loads_its_encoder(tiny_checkpoint, tmp_path):
    folder = save_distilbert(
        tiny_checkpoint, tmp_path / "cls", cls="DistilBertForSequenceClassification"
    )
    import transformers

    theirs = transformers.DistilBertForSequenceClassification.from_pretrained(folder).eval()
    with pytest.warns(UserWarning, match="skipped 4 task-head tensors"):
        bert = Bert.load(folder, threads=1)
    ids = torch.tensor([[2, 10, 11, 3]])
    with torch.no_grad():
        want = theirs.distilbert(ids).last_hidden_state
        got = bert.model(ids, torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_what_is_not_equivalent_is_refused(distil, tmp_path):
    folder = tmp_path / "sin"
    shutil.copytree(distil, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "sinusoidal_pos_embds": True}))
    with pytest.raises(ModelFolderError, match="sinusoidal_pos_embds=true is not supported"):
        Bert.load(folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "deberta"}))
    with pytest.raises(
        ModelFolderError, match="'deberta' is not supported.*'bert', 'deberta-v2', 'distilbert'"
    ):
        Bert.load(folder)


def test_a_distilbert_tagger_like_transformers(tiny_checkpoint, tmp_path):
    import transformers

    import bertattn

    folder = save_distilbert(
        tiny_checkpoint, tmp_path / "tag", cls="DistilBertForTokenClassification"
    )
    texts = ["the attention head looks at every token", "hello world, the bert model is ok!"]
    theirs = transformers.pipeline("token-classification", model=str(folder))
    ours = bertattn.pipeline("token-classification", folder)
    for strategy in ("none", "simple", "first"):
        got = ours(texts, aggregation_strategy=strategy, ignore_labels=[])
        want = theirs(texts, aggregation_strategy=strategy, ignore_labels=[])
        assert [[e["word"] for e in row] for row in got] == [
            [e["word"] for e in row] for row in want
        ]
        key = "entity" if strategy == "none" else "entity_group"
        assert [[e[key] for e in row] for row in got] == [[e[key] for e in row] for row in want]
        np.testing.assert_allclose(
            [e["score"] for row in got for e in row],
            [e["score"] for row in want for e in row],
            atol=1e-5,
        )
