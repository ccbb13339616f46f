"""``attn_implementation="bertattn"`` on BERT's family in transformers: RoBERTa, XLM-RoBERTa,
DistilBERT and ELECTRA models (random weights, a fixed seed, tiny sizes) give the hidden states
of transformers' own ``sdpa`` and ``eager`` on a padded batch, the attention weights of
``eager``, and the gradients of ``sdpa``; and bertattn's own backend ran (the dispatch is
recorded), so the equality is not transformers running its own attention twice."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_integrations_transformers import tiny_batch  # noqa: E402

import bertattn  # noqa: E402
import bertattn.integrations.transformers  # noqa: E402, F401  (registers "bertattn")

SIZES = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "vocab_size": 99,
    "max_position_embeddings": 64,
}
FAMILIES = {
    "roberta": {**SIZES, "pad_token_id": 1},
    "xlm-roberta": {**SIZES, "pad_token_id": 1},
    "electra": {**SIZES, "embedding_size": 32},
    "distilbert": {
        "dim": 32,
        "n_layers": 2,
        "n_heads": 4,
        "hidden_dim": 37,
        "vocab_size": 99,
        "max_position_embeddings": 64,
    },
}


def _batch() -> dict[str, torch.Tensor]:
    """The padded batch of the BERT adapter tests, padded with the families' id 1."""
    batch = tiny_batch()
    batch["input_ids"][batch["attention_mask"] == 0] = 1
    return batch


def _models(family: str, tmp_path) -> dict[str, torch.nn.Module]:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(family, **FAMILIES[family])
    transformers.AutoModel.from_config(cfg).save_pretrained(tmp_path)
    return {
        impl: transformers.AutoModel.from_pretrained(tmp_path, attn_implementation=impl).eval()
        for impl in ("bertattn", "sdpa", "eager")
    }


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hidden_states_and_attentions_equal_transformers(family, tmp_path):
    models = _models(family, tmp_path)
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad(), bertattn.explain() as log:
        ours = models["bertattn"](**batch, output_attentions=True)
    assert log.records, f"{family}: bertattn's attention never ran"
    with torch.no_grad():
        sdpa = models["sdpa"](**batch).last_hidden_state
        eager = models["eager"](**batch, output_attentions=True)
    for ref in (sdpa, eager.last_hidden_state):
        torch.testing.assert_close(ours.last_hidden_state[real], ref[real], rtol=0, atol=1e-5)
    assert len(ours.attentions) == len(eager.attentions) == 2
    for a, b in zip(ours.attentions, eager.attentions, strict=True):
        keep = real[:, None, :, None] & real[:, None, None, :]  # (B, 1, L, L): real rows x keys
        torch.testing.assert_close(a * keep, b * keep, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gradients_equal_sdpa(family, tmp_path):
    batch = _batch()
    grads = {}
    for impl in ("bertattn", "sdpa"):
        model = _models(family, tmp_path)[impl].train(False)
        out = model(**batch).last_hidden_state
        (out * batch["attention_mask"][..., None]).square().sum().backward()
        grads[impl] = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads["bertattn"]) == len(grads["sdpa"]) > 0
    for a, b in zip(grads["bertattn"], grads["sdpa"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
