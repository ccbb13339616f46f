"""Qwen3 embedders through ``Bert.load`` / ``encode``: a sentence-transformers folder of a random
``Qwen3Model`` (causal, grouped-query heads) with last-token pooling, instruction prompts and a
Normalize module, as Qwen3-Embedding's hub folder is laid out, against ``SentenceTransformer``
on the same folder, its tokenizer padding on the right or on the left; the pooling itself on
masks padded either way; late chunking refusing it (library and command line)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_bert import save_random

from bertattn import Bert
from bertattn.encoder.pooling import pool

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
    num_key_value_heads=2, head_dim=10, intermediate_size=29, max_position_embeddings=600,
    rms_norm_eps=1e-6, pad_token_id=0,
)  # fmt: skip
PROMPTS = {"query": "Instruct: find the passage that answers the question\nQuery: ", "document": ""}
TEXTS = ["the attention head looks at every token", "hello", "a model and a layer, ok", "a b"]
#: Qwen3-Embedding-0.6B's 1_Pooling/config.json, at this model's width
HUB_POOLING = {
    "word_embedding_dimension": 36, "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": True, "include_prompt": True,
}  # fmt: skip


@pytest.fixture(scope="module")
def qwen3_st(tmp_path_factory, tiny_checkpoint) -> Path:
    """A sentence-transformers folder: Transformer (the random Qwen3, the tiny BERT's
    tokenizer), Pooling (last token), Normalize; prompts in its config. Saved by
    sentence-transformers, then its Pooling config rewritten as the hub's folder has it."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    base = tmp_path_factory.mktemp("qwen3_base")
    save_random(transformers.Qwen3Model, transformers.Qwen3Config(**SIZES), base, 7,
                tiny_checkpoint)  # fmt: skip
    st = SentenceTransformer(
        modules=[Transformer(str(base)), Pooling(36, "lasttoken"), Normalize()],
        prompts=PROMPTS,
        default_prompt_name="document",
        device="cpu",
    )
    folder = tmp_path_factory.mktemp("qwen3_st")
    st.save(str(folder))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(HUB_POOLING))
    return folder


def _padding_side(folder: Path, side: str) -> None:
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "padding_side": side}))


@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_equals_sentence_transformers(qwen3_st: Path, side: str) -> None:
    from sentence_transformers import SentenceTransformer

    _padding_side(qwen3_st, side)
    st = SentenceTransformer(str(qwen3_st), device="cpu")
    assert st[0].tokenizer.padding_side == side and st[1].pooling_mode == "lasttoken"
    bert = Bert.load(qwen3_st, threads=1)
    assert bert.pooling == "lasttoken" and bert.prompts == PROMPTS
    for prompt_name in ("query", None):  # None: the folder's default prompt ("document")
        want = st.encode(TEXTS, prompt_name=prompt_name)
        got = bert.encode(TEXTS, prompt_name=prompt_name)
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cos.min() >= 0.99999, (prompt_name, cos)
        np.testing.assert_allclose(got, want, atol=1e-5)
    # the prompt and the pooling matter: another prompt, or mean pooling, gives other rows
    assert np.abs(bert.encode(TEXTS, prompt_name="query") - bert.encode(TEXTS)).max() > 1e-3
    assert np.abs(bert.encode(TEXTS, pooling="mean") - bert.encode(TEXTS)).max() > 1e-3


def test_the_folders_pooling_mode_string_is_read(qwen3_st: Path, tmp_path: Path) -> None:
    """sentence-transformers >= 6 writes ``"pooling_mode": "lasttoken"`` instead of the flags."""
    import shutil

    folder = tmp_path / "st"
    shutil.copytree(qwen3_st, folder)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"embedding_dimension": 36, "pooling_mode": "lasttoken"})
    )
    assert Bert.load(folder, threads=1).pooling == "lasttoken"


def test_last_token_pooling_on_right_and_left_padding() -> None:
    hidden = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)  # (B, L, E)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    # row 0: position 1 (right) / 3 (left); row 1: position 3; row 2 has no token: zeros
    torch.testing.assert_close(pool(hidden, right, "lasttoken"),
                               torch.tensor([[2.0, 3.0], [14.0, 15.0], [0.0, 0.0]]))  # fmt: skip
    torch.testing.assert_close(pool(hidden, left, "lasttoken"),
                               torch.tensor([[6.0, 7.0], [14.0, 15.0], [0.0, 0.0]]))  # fmt: skip


def test_late_chunks_refuse_last_token_pooling(qwen3_st: Path) -> None:
    bert = Bert.load(qwen3_st, threads=1)
    with pytest.raises(ValueError, match=r"pooling 'lasttoken' has one last-token state for the "
                       r"whole text, not one per span: .* pass pooling='mean'"):  # fmt: skip
        bert.encode_late_chunks("a b c d", [(0, 3), (4, 7)])


def test_late_chunks_command_refuses_a_last_token_folder(qwen3_st: Path, cli, tmp_path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "a b c d", "spans": [[0, 3], [4, 7]]}) + "\n")
    r = cli("encode", source, "-o", tmp_path / "o.npy", "--late-chunks", "--model", qwen3_st)
    assert r.code == 2
    assert "the model folder pools its last token" in r.err and "--pooling mean" in r.err, r
