"""EuroBERT in bertattn's own encoder: random ``EuroBertModel`` folders (a tiny odd size: 6 query
heads sharing 2 key/value heads of size 10 in a 36-wide model, seeded noise on every parameter)
saved by transformers, against transformers' native class on padded batches (right and left
padding) and packed mixed lengths, on every backend; the biased variant; a hub folder's
``rope_theta``; bad folders refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import family_helpers as fam
import pytest
import torch
from tiny_bert import save_random

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
    num_key_value_heads=2, head_dim=10, intermediate_size=29, max_position_embeddings=600,
    rms_norm_eps=1e-5, pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
    rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
)  # fmt: skip
BACKENDS = ("auto", "math", "sdpa", "varlen")


def _save(
    folder: Path, seed: int = 0, tokenizer_from: Path | None = None, **overrides: object
) -> torch.nn.Module:
    import transformers

    config = transformers.EuroBertConfig(**{**SIZES, **overrides})
    return save_random(transformers.EuroBertModel, config, folder, seed, tokenizer_from)


@pytest.fixture(scope="module")
def eurobert(tmp_path_factory, tiny_checkpoint) -> tuple[Path, torch.nn.Module]:
    """The random EuroBERT folder, with the tiny BERT's tokenizer (99 tokens, as the model)."""
    folder = tmp_path_factory.mktemp("eurobert")
    return folder, _save(folder, tokenizer_from=tiny_checkpoint)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_hidden_states_equal_transformers(eurobert, backend: str, left: bool) -> None:
    fam.assert_states_equal(*eurobert, backend, *fam.padded_batch([37, 12, 25, 3], left=left))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_lengths_equal_transformers_one_text_at_a_time(eurobert, backend: str) -> None:
    """Texts of mixed lengths in one batch (packed into one row of real tokens by ``varlen``
    and by ``auto`` on the CPU, padded by ``math`` and ``sdpa``), each text's states against
    transformers on that text alone, with no padding at all."""
    folder, hf = eurobert
    fam.assert_each_text_alone_equal(folder, hf, backend)


def test_encode_equals_sentence_transformers(eurobert, tmp_path: Path) -> None:
    folder, _ = eurobert
    texts = ["the attention head looks at every token", "hello", "a model and a layer, ok"]
    fam.assert_encode_equals_sentence_transformers(folder, SIZES["hidden_size"], texts, tmp_path)


def test_bidirectional_a_token_sees_the_tokens_after_it(eurobert) -> None:
    """Changing the last token changes the first token's state (a causal encoder could not)."""
    folder, _ = eurobert
    ids, mask = fam.padded_batch([12, 12])
    ids[1, -1] = (ids[0, -1] + 1) % 90 + 5
    hidden = fam.states(folder, "auto", ids, mask)
    assert (hidden[0, 0] - hidden[1, 0]).abs().max() > 1e-3


def test_biased_projections_load(tmp_path: Path) -> None:
    hf = _save(tmp_path, seed=5, attention_bias=True, mlp_bias=True)
    assert hf.layers[0].mlp.gate_proj.bias is not None
    for backend in ("math", "varlen"):
        fam.assert_states_equal(tmp_path, hf, backend, *fam.padded_batch([21, 9]))


def test_a_masked_lm_checkpoint_loads_its_encoder(tmp_path: Path) -> None:
    """The hub's EuroBERT folders are ``EuroBertForMaskedLM`` checkpoints (``model.`` + the
    encoder, ``lm_head``): the encoder loads, the head is skipped and said."""
    import transformers

    config = transformers.EuroBertConfig(**SIZES)
    hf = save_random(transformers.EuroBertForMaskedLM, config, tmp_path, 2)
    ids, mask = fam.padded_batch([20, 7])
    with torch.no_grad():
        want = hf.model(input_ids=ids, attention_mask=mask).last_hidden_state
    with pytest.warns(UserWarning, match=r"skipped 1 task-head tensors: lm_head.weight"):
        got = fam.states(tmp_path, "auto", ids, mask)
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_a_hub_folders_rope_theta_is_read(eurobert, tmp_path: Path) -> None:
    """The hub's EuroBERT folders write ``rope_theta`` at the top (no ``rope_parameters``):
    the same rotation."""
    folder, hf = eurobert
    data = json.loads((folder / "config.json").read_text())
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
    data["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(data))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    fam.assert_states_equal(tmp_path, hf, "auto", *fam.padded_batch([19, 6]))
    data["rope_theta"] = 10000.0
    (tmp_path / "config.json").write_text(json.dumps(data))
    ids, mask = fam.padded_batch([19, 6])
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (fam.states(tmp_path, "auto", ids, mask) - want)[mask.bool()].abs().max() > 1e-3


def test_explain_names_the_shared_heads_and_no_causal_mask(eurobert) -> None:
    folder, _ = eurobert
    text = fam.explain_varlen(folder, [30, 4])
    assert "2 key/value heads, each shared by 3 query heads" in text
    assert "causal" not in text
    assert "q/k norm" not in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling=.* is not "
         r"supported; bertattn loads EuroBERT checkpoints with rope_scaling null"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1.0}},
         r"rope_parameters.rope_type='linear' is not supported; .* with 'default'"),
        ({"num_key_value_heads": 4}, r"num_key_value_heads=4 is not supported; .* a divisor of "
         r"num_attention_heads \(6\)"),
        ({"head_dim": 0}, r"head_dim=0 is not supported; .* an int >= 1"),
        ({"hidden_act": "nope"}, r"config.json: .*nope"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(tmp_path: Path, override: dict, message: str) -> None:
    fam.assert_config_refused(tmp_path, {**SIZES, "model_type": "eurobert", **override}, message)
