"""Qwen3 in bertattn's own encoder: random ``Qwen3Model`` folders (a tiny odd size: 6 query heads
sharing 2 key/value heads of size 10 in a 36-wide model, seeded noise on every parameter) saved
by transformers, against transformers' native class on padded batches (right and left padding)
and packed mixed lengths, on every backend; causal by default, bidirectional by the config;
bad folders refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_helpers import assert_config_refused, assert_states_equal, explain_varlen, padded_batch
from family_helpers import states as _ours
from tiny_bert import save_random

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
    num_key_value_heads=2, head_dim=10, intermediate_size=29, max_position_embeddings=600,
    rms_norm_eps=1e-6, pad_token_id=0,
)  # fmt: skip
BACKENDS = ("auto", "math", "sdpa", "varlen")


def _save(folder: Path, seed: int = 0, **overrides: object) -> torch.nn.Module:
    import transformers

    config = transformers.Qwen3Config(**{**SIZES, **overrides})
    return save_random(transformers.Qwen3Model, config, folder, seed)


@pytest.fixture(scope="module")
def causal(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen3")
    return folder, _save(folder)


@pytest.fixture(scope="module")
def bidirectional(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("qwen3_bi")
    return folder, _save(folder, seed=3, use_bidirectional_attention=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_causal_hidden_states_equal_transformers(causal, backend: str, left: bool) -> None:
    assert_states_equal(*causal, backend, *padded_batch([37, 12, 25, 3], left=left))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bidirectional_by_config_equals_transformers_with_a_full_mask(
    bidirectional, backend: str
) -> None:
    """transformers' class is causal whatever the config says; given a (B, 1, L, L) mask that
    lets every real token see every real token it is the bidirectional reference."""
    folder, hf = bidirectional
    assert json.loads((folder / "config.json").read_text())["use_bidirectional_attention"]
    ids, mask = padded_batch([30, 8, 19])
    keep = mask.bool()
    full = keep[:, None, None, :].expand(3, 1, 30, 30)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=full).last_hidden_state
        causal_want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (want[keep] - causal_want[keep]).abs().max() > 0.1  # the two references differ
    got = _ours(folder, backend, ids, mask)
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_attention_biases_load(tmp_path: Path) -> None:
    hf = _save(tmp_path, seed=5, attention_bias=True)
    assert_states_equal(tmp_path, hf, "auto", *padded_batch([21, 9]))


def test_explain_names_the_shared_heads_and_the_causal_mask(causal) -> None:
    folder, _ = causal
    text = explain_varlen(folder, [30, 4])
    assert "2 key/value heads, each shared by 3 query heads" in text
    assert "causal: query i sees keys j <= i only" in text
    assert "q/k norm" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling=.* is not "
         r"supported; bertattn loads Qwen3 checkpoints with rope_scaling null"),
        ({"use_sliding_window": True}, r"use_sliding_window=True is not supported; .* "
         r"use_sliding_window false"),
        ({"num_key_value_heads": 4}, r"num_key_value_heads=4 is not supported; .* a divisor of "
         r"num_attention_heads \(6\)"),
        ({"head_dim": 0}, r"head_dim=0 is not supported; .* an int >= 1"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(tmp_path: Path, override: dict, message: str) -> None:
    assert_config_refused(tmp_path, {**SIZES, "model_type": "qwen3", **override}, message)
