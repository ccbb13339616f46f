"""GTE, NomicBERT and Jina v3 in bertattn's own encoder: random folders of transformers' native
classes (tiny odd sizes, seeded noise on every parameter) against those classes on padded
batches, text pairs and packed mixed lengths on every backend; ``Bert.encode`` against
sentence-transformers; the pooler of a checkpoint that has one; bad settings refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_helpers import (
    TOKENIZER_FILES,
    assert_encode_equals_sentence_transformers,
    assert_tagger_equals_pipeline,
    copy_with_config,
    save_with_seeded_head,
)
from tiny_bert import save_random

from bertattn import BertModel
from bertattn.errors import ModelFolderError

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
    intermediate_size=29, max_position_embeddings=300, pad_token_id=0,
)  # fmt: skip
#: (model class, config class, extra settings)
KINDS = {
    "gte": ("GteModel", "GteConfig", {"type_vocab_size": 2}),
    "gte-no-types": ("GteModel", "GteConfig", {"type_vocab_size": 0}),
    "nomic_bert": ("NomicBertModel", "NomicBertConfig", {}),
    "jina_embeddings_v3": ("JinaEmbeddingsV3Model", "JinaEmbeddingsV3Config", {}),
}
TEXTS = ["the attention head looks at every token", "hello", "a model and a layer, ok"]


@pytest.fixture(scope="module", params=sorted(KINDS))
def family(request, tmp_path_factory, tiny_checkpoint) -> tuple[str, Path, torch.nn.Module]:
    import transformers

    model_name, config_name, extra = KINDS[request.param]
    config = getattr(transformers, config_name)(**{**SIZES, **extra})
    folder = tmp_path_factory.mktemp(request.param)
    model = save_random(getattr(transformers, model_name), config, folder, 3, tiny_checkpoint)
    return request.param, folder, model


def _batch(lengths: list[int], pair_from: int | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    n = max(lengths)
    ids = torch.randint(5, 99, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    batch = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    if pair_from is not None:
        types = torch.zeros_like(mask)
        types[:, pair_from:] = 1
        batch["token_type_ids"] = types * mask
    return batch


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
def test_hidden_states_equal_transformers(family, backend: str) -> None:
    kind, folder, hf = family
    batch = _batch([40, 7, 23], pair_from=None if kind == "gte-no-types" else 5)
    if kind in ("jina_embeddings_v3",):  # one token type: every token is segment 0
        batch.pop("token_type_ids")
    with torch.no_grad():
        want = hf(**batch).last_hidden_state
        got = BertModel.from_pretrained(folder, backend=backend)(**batch).last_hidden_state
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_encode_equals_sentence_transformers(family, tmp_path) -> None:
    _, folder, _ = family
    assert_encode_equals_sentence_transformers(folder, SIZES["hidden_size"], TEXTS, tmp_path)


def test_jina_pooler_equals_transformers(tmp_path, tiny_checkpoint) -> None:
    import transformers

    config = transformers.JinaEmbeddingsV3Config(**SIZES)
    cls = transformers.JinaEmbeddingsV3Model
    hf = save_random(lambda c: cls(c, add_pooling_layer=True), config, tmp_path / "j", 5)
    batch = _batch([12, 30])
    with torch.no_grad():
        want = hf(**batch).pooler_output
        got = BertModel.from_pretrained(tmp_path / "j")(**batch).pooler_output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10.0}},
         r"rope_parameters.rope_type='dynamic' is not supported"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_scaling=.* is not supported"),
        ({"hidden_act": "mish"}, r"hidden_act='mish' is not supported"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_by_field(family, tmp_path, changes, message) -> None:
    _, folder, _ = family
    bad = copy_with_config(folder, tmp_path / "bad", **changes)
    with pytest.raises(ModelFolderError, match=message):
        BertModel.from_pretrained(bad)


@pytest.mark.parametrize("name", ["Gte", "NomicBert"])
def test_rerankers_equal_transformers_and_sentence_transformers(name, tmp_path, tiny_checkpoint):
    """``GteForSequenceClassification`` / ``NomicBertForSequenceClassification`` (BERT's
    head: the pooler, then a linear layer; saved under ``gte.`` / ``nomic_bert.``): logits
    equal to transformers', scores to sentence-transformers' CrossEncoder."""
    import transformers
    from family_helpers import assert_reranker_equals_peers

    config = getattr(transformers, f"{name}Config")(**SIZES, num_labels=1, type_vocab_size=2)
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForSequenceClassification")(config).eval()
    pairs = [("the attention head", "looks at every token"), ("hello", "a model and a layer")]
    assert_reranker_equals_peers(model, tiny_checkpoint, 3, pairs, tmp_path)


def test_a_gte_tagger_equals_transformers_pipeline(tmp_path, tiny_checkpoint) -> None:
    import transformers

    labels = {0: "O", 1: "B-X", 2: "I-X"}
    config = transformers.GteConfig(**SIZES, num_labels=3, id2label=labels,
                                    label2id={v: k for k, v in labels.items()})  # fmt: skip
    model = save_random(transformers.GteForTokenClassification, config, tmp_path / "t", 6)
    names = ("vocab.txt", *TOKENIZER_FILES)
    save_with_seeded_head(model, tmp_path / "t", 2, tiny_checkpoint, names)  # it tags something
    texts = ["the attention head looks at every token", "hello world, a model"]
    assert_tagger_equals_pipeline(tmp_path / "t", texts)
