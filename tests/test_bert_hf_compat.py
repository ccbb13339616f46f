"""``bertattn.BertModel`` as a drop-in for ``transformers.BertModel``: the output's
``ModelOutput`` behaviour, the forward keywords (``output_hidden_states``, ``position_ids``,
``inputs_embeds``, ``return_dict``) and the ``from_pretrained`` keywords, checked against
transformers' eager BertModel on the tiny random checkpoint and on the real MiniLM."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
import transformers

from bertattn import BertModel
from bertattn.encoder import BertModelOutput

BACKENDS = ["auto", "math", "sdpa", "varlen"]


@pytest.fixture(scope="module", params=["tiny_checkpoint", "minilm_dir"])
def folder(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def ours(folder):
    return {b: BertModel.from_pretrained(folder, backend=b) for b in BACKENDS}


def _batch(vocab: int):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, min(vocab, 1000), (3, 11), generator=g)
    ids[:, 0] = 2 if vocab < 1000 else 101
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    ids = ids * mask  # [PAD] = 0 at the padding
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return ids, mask, types


def _hf_keys(ref) -> list[str]:
    """transformers' keys without ``cross_attentions``: its encoder-only BertModel returns an
    empty tuple there when attentions are asked for; bertattn has no cross-attention field."""
    assert len(ref.get("cross_attentions") or ()) == 0
    return [k for k in ref.keys() if k != "cross_attentions"]


def _hf_tuple(ref: tuple) -> tuple:
    return ref[:-1] if ref and isinstance(ref[-1], tuple) and len(ref[-1]) == 0 else ref


def _close_real(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, atol: float = 1e-5):
    """Equal on the real tokens (transformers leaves values at padding, packed runs zeros)."""
    real = mask.bool()
    torch.testing.assert_close(a[real], b[real], atol=atol, rtol=1e-4)


# ---------------------------------------------------------------------- output structure
def test_output_indexes_like_model_output(hf, ours):
    ids, mask, types = _batch(hf.config.vocab_size)
    model = ours["math"]
    with torch.no_grad():
        for kw in (
            {},
            {"output_hidden_states": True},
            {"output_attentions": True},
            {"output_hidden_states": True, "output_attentions": True},
        ):
            ref = hf(ids, mask, types, **kw)
            out = model(ids, mask, types, **kw)
            assert list(out.keys()) == _hf_keys(ref), kw
            assert list(out) == _hf_keys(ref), kw
            assert len(out) == len(_hf_keys(ref)) == len(out.to_tuple())
            assert out[0] is out.last_hidden_state
            assert out[1] is out.pooler_output
            assert out["last_hidden_state"] is out.last_hidden_state
            assert "last_hidden_state" in out
            assert [type(v) for v in out.to_tuple()] == [type(v) for v in _hf_tuple(ref.to_tuple())]
            assert all(a is b for a, b in zip(out[:2], out.to_tuple()[:2], strict=True))
            for k in _hf_keys(ref):
                if k in ("hidden_states", "attentions"):
                    assert len(out[k]) == len(ref[k])
            assert [k for k, _ in out.items()] == _hf_keys(ref)
    plain = model(ids, mask)
    assert list(plain.keys()) == ["last_hidden_state", "pooler_output"]
    with pytest.raises(KeyError):
        plain["hidden_states"]
    with pytest.raises(IndexError):
        plain[2]


def test_output_without_pooler_skips_it():
    out = BertModelOutput(torch.zeros(1, 2, 3), None)
    assert out.keys() == ["last_hidden_state"]
    assert out.to_tuple() == (out.last_hidden_state,)
    assert out[0] is out.last_hidden_state


# ---------------------------------------------------------------------- hidden states
@pytest.mark.parametrize("backend", BACKENDS)
def test_hidden_states_match_transformers(hf, ours, backend):
    ids, mask, types = _batch(hf.config.vocab_size)
    model = ours[backend]
    with torch.no_grad():
        ref = hf(ids, mask, types, output_hidden_states=True)
        out = model(ids, mask, types, output_hidden_states=True)
    n = hf.config.num_hidden_layers
    assert isinstance(out.hidden_states, tuple) and len(out.hidden_states) == n + 1
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states, strict=True)):
        assert a.shape == b.shape, i
        _close_real(a, b, mask)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, atol=0, rtol=0)
    _close_real(out.last_hidden_state, ref.last_hidden_state, mask)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=1e-4)
    assert model(ids, mask, types).hidden_states is None


def test_hidden_states_padded_path_matches_everywhere(hf, ours):
    """The non-packed math path reproduces transformers even at the padding positions."""
    ids, mask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(ids, mask, types, output_hidden_states=True)
        out = ours["math"](ids, mask, types, output_hidden_states=True)
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)  # padding rows: looser


# ---------------------------------------------------------------------- position_ids
@pytest.mark.parametrize("backend", ["auto", "math", "varlen"])
@pytest.mark.parametrize("rows", [1, 3])
def test_position_ids_match_transformers(hf, ours, backend, rows):
    ids, mask, types = _batch(hf.config.vocab_size)
    g = torch.Generator().manual_seed(rows)
    if rows == 1:
        positions = (torch.arange(ids.shape[1]) + 5).unsqueeze(0)  # (1, L), shifted
    else:
        positions = torch.randint(0, 40, ids.shape, generator=g)  # (B, L), arbitrary
    with torch.no_grad():
        ref = hf(ids, mask, types, position_ids=positions)
        out = ours[backend](ids, mask, types, position_ids=positions)
        default = ours[backend](ids, mask, types)
    _close_real(out.last_hidden_state, ref.last_hidden_state, mask)
    assert not torch.allclose(out.pooler_output, default.pooler_output, atol=1e-4)


def test_position_ids_bad_shape(ours):
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="position_ids"):
        ours["math"](ids, position_ids=torch.arange(3).unsqueeze(0))


# ---------------------------------------------------------------------- inputs_embeds
@pytest.mark.parametrize("backend", ["auto", "math", "varlen"])
def test_inputs_embeds_match_transformers(hf, ours, backend):
    ids, mask, types = _batch(hf.config.vocab_size)
    model = ours[backend]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        looked_up = hf.embeddings.word_embeddings(ids)
        out = model(inputs_embeds=looked_up, attention_mask=mask, token_type_ids=types)
        by_ids = model(ids, mask, types)
        _close_real(out.last_hidden_state, by_ids.last_hidden_state, mask)
        free = torch.randn(looked_up.shape, generator=g)  # no lookup could give these
        ref = hf(
            inputs_embeds=free, attention_mask=mask, token_type_ids=types, output_hidden_states=True
        )
        out = model(
            inputs_embeds=free, attention_mask=mask, token_type_ids=types, output_hidden_states=True
        )
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        _close_real(a, b, mask)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=1e-4)


def test_inputs_embeds_and_ids_exclusive(ours):
    ids = torch.ones(1, 3, dtype=torch.long)
    e = ours["math"].config.hidden_size
    with pytest.raises(ValueError, match="input_ids"):
        ours["math"](ids, inputs_embeds=torch.zeros(1, 3, e))
    with pytest.raises(ValueError, match="input_ids"):
        ours["math"]()
    with pytest.raises(ValueError, match="inputs_embeds"):
        ours["math"](inputs_embeds=torch.zeros(1, 3, e + 1))


# ---------------------------------------------------------------------- return_dict=False
def test_return_dict_false_is_a_tuple_like_transformers(hf, ours):
    ids, mask, types = _batch(hf.config.vocab_size)
    with torch.no_grad():
        for kw in (
            {},
            {"output_hidden_states": True},
            {"output_hidden_states": True, "output_attentions": True},
        ):
            ref = _hf_tuple(hf(ids, mask, types, return_dict=False, **kw))
            out = ours["math"](ids, mask, types, return_dict=False, **kw)
            assert type(out) is tuple and type(ref) is tuple
            assert len(out) == len(ref), kw
            for a, b in zip(out, ref, strict=True):
                if isinstance(b, tuple):
                    assert isinstance(a, tuple) and len(a) == len(b)
                else:
                    assert a.shape == b.shape
            _close_real(out[0], ref[0], mask)


# ---------------------------------------------------------------------- refusals
def test_forward_refusals(ours):
    ids = torch.ones(1, 3, dtype=torch.long)
    model = ours["math"]
    with pytest.raises(NotImplementedError, match="head_mask"):
        model(
            ids,
            head_mask=torch.ones(model.config.num_hidden_layers, model.config.num_attention_heads),
        )
    with pytest.raises(TypeError, match="encoder_hidden_states"):
        model(ids, encoder_hidden_states=torch.zeros(1, 3, model.config.hidden_size))
    with pytest.raises(TypeError, match="bogus_flag"):
        model(ids, bogus_flag=True)
    model(ids, head_mask=None)  # None is fine


# ---------------------------------------------------------------------- from_pretrained
def test_from_pretrained_torch_dtype_bf16(tiny_checkpoint):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the slow-half-precision CPU warning
        model = BertModel.from_pretrained(tiny_checkpoint, torch_dtype=torch.bfloat16)
        same = BertModel.from_pretrained(
            tiny_checkpoint, dtype="bfloat16", torch_dtype=torch.bfloat16
        )
    assert model.dtype == torch.bfloat16 == same.dtype
    assert model.encoder.layers[0].mlp.fc_in.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="torch_dtype"):
        BertModel.from_pretrained(tiny_checkpoint, dtype=torch.float16, torch_dtype=torch.bfloat16)


def test_from_pretrained_dtype_auto(tiny_checkpoint, minilm_dir, tmp_path):
    assert BertModel.from_pretrained(tiny_checkpoint, dtype="auto").dtype == torch.float32
    assert BertModel.from_pretrained(minilm_dir, torch_dtype="auto").dtype == torch.float32
    folder = tmp_path / "bf16"
    shutil.copytree(tiny_checkpoint, folder)
    for key in ("dtype", "torch_dtype"):
        config = json.loads((tiny_checkpoint / "config.json").read_text())
        config.pop("dtype", None)
        config[key] = "bfloat16"
        (folder / "config.json").write_text(json.dumps(config))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert BertModel.from_pretrained(folder, dtype="auto").dtype == torch.bfloat16, key
    config.pop("torch_dtype")
    (folder / "config.json").write_text(json.dumps(config))
    assert BertModel.from_pretrained(folder, dtype="auto").dtype == torch.float32


def test_from_pretrained_attn_implementation(tiny_checkpoint):
    assert BertModel.from_pretrained(tiny_checkpoint, attn_implementation="eager").backend == "math"
    assert BertModel.from_pretrained(tiny_checkpoint, attn_implementation="sdpa").backend == "sdpa"
    with pytest.raises(ValueError, match="attn_implementation"):
        BertModel.from_pretrained(tiny_checkpoint, attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="contradicts"):
        BertModel.from_pretrained(tiny_checkpoint, attn_implementation="eager", backend="sdpa")


def test_from_pretrained_refusals(tiny_checkpoint, monkeypatch):
    with pytest.raises(ValueError, match="revision"):
        BertModel.from_pretrained(tiny_checkpoint, revision="v2")
    BertModel.from_pretrained(tiny_checkpoint, revision="main", local_files_only=True)
    with pytest.raises(TypeError, match="trust_remote_code"):
        BertModel.from_pretrained(tiny_checkpoint, trust_remote_code=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="local_files_only=False"):
        BertModel.from_pretrained("some-org/some-model", local_files_only=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(ValueError, match="local_files_only=True"):
        BertModel.from_pretrained("some-org/some-model", local_files_only=True)
