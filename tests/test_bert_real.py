"""The real all-MiniLM-L6-v2 checkpoint against transformers and sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertattn
from bertattn import Bert

SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "Hi",
    "Attention is all you need, or so the 2017 paper by Vaswani et al. claimed in its title.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "",
    "BERT uses WordPiece tokenization: unaffable -> un ##aff ##able.",
    "The quick brown fox jumps over the lazy dog while the cat, unimpressed, keeps sleeping "
    "on the warm windowsill in the late afternoon sun.",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bert(minilm_dir):
    return Bert.load(minilm_dir)


@pytest.fixture(scope="module")
def hf_model(minilm_dir):
    import transformers
    return transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()


def test_hidden_states_and_attentions_match_transformers(bert, hf_model):
    batch = bert.tokenizer(SENTENCES)
    assert batch.attention_mask.sum(1).min() < batch.attention_mask.shape[1]  # padding present
    args = (batch.input_ids, batch.attention_mask, batch.token_type_ids)
    with torch.no_grad():
        ref = hf_model(*args, output_attentions=True)
        out = bert.model(*args, output_attentions=True)
        fused = bert.model(*args)  # sdpa under auto
    real = batch.attention_mask.bool()
    for hidden in (out.last_hidden_state, fused.last_hidden_state):
        diff = (hidden - ref.last_hidden_state)[real].abs().max().item()
        assert diff < 1e-4, diff
    assert (out.pooler_output - ref.pooler_output).abs().max().item() < 1e-4
    assert len(out.attentions) == 6
    for ours, theirs in zip(out.attentions, ref.attentions, strict=True):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max().item() < 1e-5


def test_encode_matches_sentence_transformers(bert, minilm_dir):
    import sentence_transformers as st
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES, batch_size=3)
    ours = Bert.load().encode(SENTENCES, batch_size=3)  # the default model is this folder
    assert ours.dtype == np.float32 and ours.shape == (len(SENTENCES), 384)
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # Normalize module


def test_encode_order_and_options(bert):
    all_at_once = bert.encode(SENTENCES, batch_size=32)
    one_by_one = np.stack([bert.encode([s])[0] for s in SENTENCES])
    np.testing.assert_allclose(all_at_once, one_by_one, atol=1e-5)
    raw = bert.encode(SENTENCES[:2], pooling="cls", normalize=False)
    with torch.no_grad():
        b = bert.tokenizer(SENTENCES[:2])
        cls = bert.model(b.input_ids, b.attention_mask).last_hidden_state[:, 0]
    np.testing.assert_allclose(raw, cls.numpy(), atol=1e-5)
    assert bert.encode([]).shape == (0, 384)
    with torch.no_grad():  # max pooling: the largest value per dimension over real tokens
        hidden = bert.model(b.input_ids, b.attention_mask).last_hidden_state
    hidden = hidden.masked_fill(~b.attention_mask.bool()[..., None], float("-inf"))
    maxed = bert.encode(SENTENCES[:2], pooling="max", normalize=False)
    np.testing.assert_allclose(maxed, hidden.max(1).values.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="pooling 'sum' is not supported"):
        bert.encode(["x"], pooling="sum")


def test_attention_maps(bert):
    maps = bert.attention_maps("The cat sat.", pair="It was tired.", layers=[0, 5])
    assert isinstance(maps, bertattn.AttentionMaps)
    assert maps.tokens[0] == "[CLS]" and maps.tokens[-1] == "[SEP]"
    assert maps.layer_ids == [0, 5] and maps.layers[0].shape == (
        12,
        len(maps.tokens),
        len(maps.tokens),
    )
    assert (
        maps.tokens[maps.segment_start - 1] == "[SEP]" and maps.tokens[maps.segment_start] == "it"
    )
    np.testing.assert_allclose(maps.layers[1].sum(-1), 1.0, atol=1e-5)
    full = bert.attention_maps("The cat sat.", pair="It was tired.")
    assert full.layer_ids == list(range(6))
    np.testing.assert_allclose(full.layer(5), maps.layer(5), atol=1e-6)
    assert "MiniLM" in Bert.load().attention_maps("hi").model_name
