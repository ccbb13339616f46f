"""The calls sentence-transformers' own head tests make that bertattn's head classes refused
(found by ``scripts/upstream_st_tests.py``): ``encode_query`` / ``encode_document`` pass the
keywords ``encode`` does not name on to it, and ``save`` / ``save_pretrained`` take
sentence-transformers' model-card and serialization arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_heads_cross_encoder import save_classifier

from bertattn import CrossEncoder, SparseEncoder


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("up_rr"), 1, seed=3)


@pytest.fixture(scope="module")
def splade(splade_dir) -> SparseEncoder:
    return SparseEncoder(splade_dir, threads=1)


@pytest.mark.parametrize("task", ["query", "document"])
def test_encode_task_passes_unnamed_keywords_on_to_encode(splade, monkeypatch, task):
    calls = []
    monkeypatch.setattr(splade, "encode", lambda *a, **kw: calls.append(kw))
    getattr(splade, f"encode_{task}")(
        "a text", batch_size=4, normalize_embeddings=True, custom_param="value"
    )
    (got,) = calls
    assert got["normalize_embeddings"] is True and got["custom_param"] == "value"
    assert got["batch_size"] == 4 and got["task"] == task and got["inputs"] == "a text"


def test_encode_task_keyword_encode_does_not_take_is_refused_by_encode(splade):
    with pytest.raises(TypeError, match=r"encode\(\) got an unexpected keyword argument 'nope'"):
        splade.encode_query("a text", nope=1)


@pytest.mark.parametrize("safe", [True, False, None])
def test_save_pretrained_takes_safe_serialization(reranker, tmp_path, safe):
    model = CrossEncoder(reranker, threads=1)
    out = model.save_pretrained(tmp_path / "saved", safe_serialization=safe)
    assert [p.name for p in out.glob("**/model.safetensors")] == ["model.safetensors"]
    assert CrossEncoder(out, threads=1).predict([("a", "b")]).shape == (1,)


def test_save_takes_the_model_card_arguments(reranker, tmp_path):
    model = CrossEncoder(reranker, threads=1)
    out = model.save(tmp_path / "s", model_name="mine", create_model_card=False,
                     train_datasets=["org/data"])  # fmt: skip
    assert (out / "config.json").is_file()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"safe_serialization": "yes"}, r"safe_serialization must be True, False or None, got"),
        ({"create_model_card": 1}, r"create_model_card must be True or False, got"),
        ({"model_name": 3}, r"model_name must be a str or None, got"),
        ({"train_datasets": "org/data"}, r"train_datasets must be a list of dataset names"),
    ],
)
def test_save_arguments_of_the_wrong_type_are_refused_before_writing(
    reranker, tmp_path, kwargs, message
):
    model = CrossEncoder(reranker, threads=1)
    with pytest.raises(TypeError, match=message):
        model.save(tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_a_default_prompt_name_not_among_the_prompts_is_refused_in_upstreams_words(splade_dir):
    with pytest.raises(ValueError) as caught:
        SparseEncoder(splade_dir, threads=1, prompts={"query": "q: "}, default_prompt_name="nope")
    message = str(caught.value)
    assert message.startswith(
        "Default prompt name 'nope' not found in the configured prompts dictionary with keys ["
    )
    assert "'query'" in message
    assert message.endswith(
        "]. Give default_prompt_name one of them, or pass prompts={'nope': '...'}."
    )


def test_multi_vector_names_the_similarities_it_takes_as_sentence_transformers_does():
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    from bertattn import MultiVectorEncoder

    names = MultiVectorEncoder.SUPPORTED_SIMILARITY_FN_NAMES
    assert tuple(names) == tuple(STMultiVectorEncoder.SUPPORTED_SIMILARITY_FN_NAMES)
