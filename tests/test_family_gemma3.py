"""Gemma 3 (EmbeddingGemma's ``gemma3_text``, bidirectional) in bertattn's own encoder: random
``Gemma3TextModel`` folders saved by transformers (seeded noise on every parameter, so every
norm's offset weight is away from zero), against transformers' native class on padded batches
(right and left padding) and packed mixed lengths, on every backend:

* a tiny odd size: 3 query heads sharing 1 key/value head of size 16 in a 48-wide model, 4
  layers mixing sliding and full attention, a window narrower than the texts, two rotary bases;
* EmbeddingGemma-300m's shape (2 of its 24 layers, a small vocabulary): the published config
  (``EMBEDDINGGEMMA_300M`` below, as a public repository's test inlines google's config.json),
  texts longer than its window; and the same folder with that config's older field names.

Every Gemma-only part is checked to matter (the window's exact width, the norms' offset), and
bad configs are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_helpers import assert_config_refused, explain_varlen, padded_batch
from family_helpers import states as _ours
from tiny_bert import save_random

from bertattn import BertModel
from bertattn.blocks import OffsetRMSNorm

BACKENDS = ("auto", "math", "sdpa", "varlen")
TINY = dict(
    vocab_size=99, hidden_size=48, num_hidden_layers=4, num_attention_heads=3,
    num_key_value_heads=1, head_dim=16, intermediate_size=37, max_position_embeddings=600,
    sliding_window=10, query_pre_attn_scalar=20, rms_norm_eps=1e-6, pad_token_id=0,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
    },
    use_bidirectional_attention=True,
)  # fmt: skip
#: google/embeddinggemma-300m's config.json (its sizes and fields; vocab_size 262144 there)
EMBEDDINGGEMMA_300M = {
    "architectures": ["Gemma3TextModel"], "model_type": "gemma3_text",
    "_sliding_window_pattern": 6, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 768, "intermediate_size": 1152, "max_position_embeddings": 2048,
    "num_attention_heads": 3, "num_hidden_layers": 24, "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_theta": 1000000.0, "sliding_window": 512, "use_bidirectional_attention": True,
    "vocab_size": 262144,
}  # fmt: skip
#: the released shape at 2 layers (one of each type) and a vocabulary of 300
BASE = {
    **{k: v for k, v in EMBEDDINGGEMMA_300M.items() if k not in ("architectures", "model_type")},
    "vocab_size": 300, "num_hidden_layers": 2, "pad_token_id": 0,
    "layer_types": ["sliding_attention", "full_attention"],
}  # fmt: skip


def _save(folder: Path, seed: int = 0, tokenizer: Path | None = None,
          **sizes: object) -> torch.nn.Module:  # fmt: skip
    import transformers

    return save_random(transformers.Gemma3TextModel, transformers.Gemma3TextConfig(**sizes),
                       folder, seed, tokenizer)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_checkpoint) -> tuple[Path, torch.nn.Module]:
    """The tiny Gemma, with the tiny BERT's tokenizer (for the jobs that take text)."""
    folder = tmp_path_factory.mktemp("gemma3")
    return folder, _save(folder, tokenizer=tiny_checkpoint, **TINY)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gemma3_base")
    return folder, _save(folder, seed=2, **BASE)


def _theirs(hf: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).last_hidden_state


def _assert_equal(folder: Path, hf: torch.nn.Module, backend: str, lengths: list[int],
                  left: bool, vocab: int) -> None:  # fmt: skip
    ids, mask = padded_batch(lengths, left=left, vocab=vocab)
    keep = mask.bool()
    got, want = _ours(folder, backend, ids, mask), _theirs(hf, ids, mask)
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_tiny_hidden_states_equal_transformers(tiny, backend: str, left: bool) -> None:
    folder, hf = tiny
    _assert_equal(folder, hf, backend, [37, 12, 25, 3], left, 99)


@pytest.mark.parametrize("backend", BACKENDS)
def test_released_shape_equals_transformers_past_its_window(base, backend: str) -> None:
    """EmbeddingGemma-300m's shape; the longest text (300 tokens) is wider than the sliding
    layers' reach (256 on each side), so the window cuts."""
    folder, hf = base
    _assert_equal(folder, hf, backend, [300, 41, 7], False, 300)


def test_the_released_configs_older_field_names_load_the_same(base, tmp_path: Path) -> None:
    """The hub's config.json names the bases ``rope_theta`` / ``rope_local_base_freq`` and the
    layer types by ``sliding_window_pattern`` (transformers 5 writes ``rope_parameters`` and
    ``layer_types``): the same weights under that config give the same states."""
    import shutil

    folder, hf = base
    shutil.copytree(folder, tmp_path / "hub")
    old = {**EMBEDDINGGEMMA_300M, "vocab_size": 300, "num_hidden_layers": 2, "pad_token_id": 0,
           "sliding_window_pattern": 2}  # 2 layers: sliding, full  # fmt: skip
    (tmp_path / "hub" / "config.json").write_text(json.dumps(old))
    ids, mask = padded_batch([300, 9], vocab=300)
    keep = mask.bool()
    torch.testing.assert_close(_ours(tmp_path / "hub", "auto", ids, mask)[keep],
                               _theirs(hf, ids, mask)[keep], atol=1e-5, rtol=1e-5)  # fmt: skip


def test_the_windows_exact_width_matters(tiny, tmp_path: Path) -> None:
    """sliding_window 10 is a reach of 5 on each side: the same weights with a reach of 6
    (sliding_window 12), or no window (every layer full), give other states, and bertattn
    follows transformers in each."""
    import shutil

    folder, hf = tiny
    ids, mask = padded_batch([37, 30], vocab=99)
    keep = mask.bool()
    base = _theirs(hf, ids, mask)[keep]
    for name, change in (("wider", {"sliding_window": 12}),
                         ("full", {"layer_types": ["full_attention"] * 4})):  # fmt: skip
        other = tmp_path / name
        shutil.copytree(folder, other)
        data = {**json.loads((folder / "config.json").read_text()), **change}
        (other / "config.json").write_text(json.dumps(data))
        import transformers

        ref = transformers.Gemma3TextModel.from_pretrained(other).eval()
        want = _theirs(ref, ids, mask)[keep]
        assert (want - base).abs().max() > 1e-3, name
        torch.testing.assert_close(_ours(other, "auto", ids, mask)[keep], want,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


def test_the_norms_are_gemmas_offset_rmsnorm(tiny) -> None:
    """Every norm of the loaded model (four a layer, the q/k norms, the final one) scales by
    1 + its weight, the checkpoint's weight loaded unchanged."""
    folder, hf = tiny
    model = BertModel.from_pretrained(folder)
    norms = [m for m in model.modules() if isinstance(m, OffsetRMSNorm)]
    assert len(norms) == 4 * (4 + 2) + 1
    layer = model.encoder.layers[1]
    torch.testing.assert_close(layer.post_attn_norm.weight,
                               hf.layers[1].post_attention_layernorm.weight)  # fmt: skip
    x = torch.randn(5, 48)
    want = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * (1 + layer.mlp_norm.weight)
    torch.testing.assert_close(layer.mlp_norm(x), want)


def test_explain_names_the_shared_heads_the_q_k_norm_and_the_scale(tiny) -> None:
    folder, _ = tiny
    text = explain_varlen(folder, [30, 4])
    assert "1 key/value heads, each shared by 3 query heads" in text
    assert "q/k norm" in text
    assert f"scores scaled by {20**-0.5:g}" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"use_bidirectional_attention": False}, r"use_bidirectional_attention=False is not "
         r"supported; bertattn loads Gemma 3 checkpoints with use_bidirectional_attention true"),
        ({"use_bidirectional_attention": None}, r"use_bidirectional_attention=None is not "
         r"supported; .* a causal Gemma is a language model"),
        ({"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50.0 is not supported; .* "
         r"attn_logit_softcapping null"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, r"rope_scaling=.* is not "
         r"supported; .* rope_scaling null"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}},
         r"rope_parameters.full_attention.rope_type='yarn' is not supported; .* 'default'"),
        ({"layer_types": ["full_attention"] * 3}, r"layer_types=.* is not supported; .* a list "
         r"of 4 \(num_hidden_layers\) entries"),
        ({"num_key_value_heads": 2}, r"num_key_value_heads=2 is not supported; .* a divisor of "
         r"num_attention_heads \(3\)"),
        ({"query_pre_attn_scalar": 0}, r"query_pre_attn_scalar=0 is not supported; .* a number "
         r"> 0"),
        ({"sliding_window": None}, r"sliding_window=None is not supported; .* an int >= 1"),
        ({"hidden_activation": "gelu_fast"}, r"hidden_activation='gelu_fast' is not supported"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(tmp_path: Path, override: dict, message: str) -> None:
    assert_config_refused(tmp_path, {**TINY, "model_type": "gemma3_text", **override}, message)
