"""BertModel / BertConfig / checkpoint loading against transformers.BertModel on tiny configs."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tiny_bert import TINY

import bertattn
from bertattn import BertConfig, BertModel

BACKENDS = [*bertattn.BACKENDS, "auto"]


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Random values everywhere (LayerNorms included), so a swapped key cannot pass."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _hf_tiny(cls=transformers.BertModel, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = transformers.BertConfig(**{**TINY, **overrides})
    config._attn_implementation = "eager"
    model = cls(config).eval()
    _perturb(model, seed)
    return model


@pytest.fixture(scope="module")
def hf_tiny(tiny_checkpoint):
    """The oracle: transformers' eager BertModel on the shared tiny checkpoint."""
    return transformers.BertModel.from_pretrained(
        tiny_checkpoint, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def tiny_bin_dir(hf_tiny, tmp_path_factory):
    """transformers 5 always writes safetensors (safe_serialization=False is ignored), so the
    legacy .bin is written the way transformers 4 did: torch.save of the state dict."""
    d = tmp_path_factory.mktemp("tiny_bin")
    hf_tiny.config.to_json_file(d / "config.json")
    torch.save(hf_tiny.state_dict(), d / "pytorch_model.bin")
    return d


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    types = torch.zeros(3, 9, dtype=torch.long)
    types[0, 5:] = 1
    types[1, 3:6] = 1
    return ids, mask, types


def assert_real_close(ours, theirs, mask, atol=1e-5):
    """Equal on real tokens; padding positions are not compared (``auto`` may pack the batch,
    and a packed run returns zeros there: see test_matches_transformers)."""
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=atol, rtol=0)


@pytest.mark.parametrize("folder", ["tiny_checkpoint", "tiny_bin_dir"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_transformers(hf_tiny, folder, backend, request):
    model = BertModel.from_pretrained(request.getfixturevalue(folder), backend=backend)
    ids, mask, types = _batch()
    weights = bertattn.BACKENDS.get(backend) is None or bertattn.BACKENDS[backend].returns_weights
    with torch.no_grad(), bertattn.explain() as log:
        ref = hf_tiny(ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
        out = model(ids, mask, types, output_attentions=weights)
    real = mask.bool()
    if "varlen" in log.backends():  # packed: padding is never computed, and comes back as 0
        assert set(log.backends()) == {"varlen"}
        assert (out.last_hidden_state[~real] == 0).all()
        hidden, ref_hidden = out.last_hidden_state[real], ref.last_hidden_state[real]
    else:  # HF's eager padding mask only hides padded keys, so padded query rows match too
        hidden, ref_hidden = out.last_hidden_state, ref.last_hidden_state
    torch.testing.assert_close(hidden, ref_hidden, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    if weights:
        assert len(out.attentions) == 2
        for ours, theirs in zip(out.attentions, ref.attentions, strict=True):
            assert ours.shape == (3, 4, 9, 9)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    else:
        assert out.attentions is None


def test_no_mask_and_no_token_types(hf_tiny, tiny_checkpoint):
    model = BertModel.from_pretrained(tiny_checkpoint)
    ids = _batch()[0]
    with torch.no_grad():
        ref = hf_tiny(ids)
        out = model(ids)
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, atol=1e-5, rtol=0)
    assert out.attentions is None


def test_output_attentions_by_layer(tiny_checkpoint):
    model = BertModel.from_pretrained(tiny_checkpoint)
    ids, mask, types = _batch()
    with torch.no_grad(), bertattn.explain() as log:
        some = model(ids, mask, types, output_attentions=[1])
    assert log.backends() == ["sdpa", "math"]  # only the asked layer took the weights path
    with torch.no_grad():
        every = BertModel.from_pretrained(tiny_checkpoint, backend="math")(
            ids, mask, types, output_attentions=True
        )
    assert some.attentions[0] is None
    torch.testing.assert_close(some.attentions[1], every.attentions[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(some.last_hidden_state, every.last_hidden_state, atol=1e-5, rtol=0)
    with torch.no_grad():
        neg = model(ids, mask, types, output_attentions=[-1])
    assert neg.attentions[0] is None and neg.attentions[1] is not None


def test_output_attentions_errors(tiny_checkpoint):
    model = BertModel.from_pretrained(tiny_checkpoint)
    ids = _batch()[0]
    with pytest.raises(
        ValueError, match=r"layer index 2 is out of range.*valid indices are 0\.\.1"
    ):
        model(ids, output_attentions=[2])
    sdpa = BertModel.from_pretrained(tiny_checkpoint, backend="sdpa")
    with pytest.raises(ValueError, match="backend 'sdpa', which does not return them"):
        sdpa(ids, output_attentions=True)
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        BertModel.from_pretrained(tiny_checkpoint, backend="nope")


def test_dtype_argument(tiny_checkpoint, hf_tiny):
    model = BertModel.from_pretrained(tiny_checkpoint, dtype="float64")
    assert model.dtype == torch.float64
    ids, mask, types = _batch()
    with torch.no_grad():
        out = model(ids, mask, types)
        ref = hf_tiny(ids, attention_mask=mask, token_type_ids=types)
    assert_real_close(out.last_hidden_state.float(), ref.last_hidden_state, mask)


# ---------------------------------------------------------------------- checkpoints
def test_masked_lm_checkpoint_loads_and_reports_heads(tmp_path, caplog):
    mlm = _hf_tiny(transformers.BertForMaskedLM, seed=3)
    mlm.save_pretrained(tmp_path)
    keys = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("bert.") for k in keys) and any(k.startswith("cls.") for k in keys)
    with (
        caplog.at_level(logging.INFO, logger="bertattn.encoder"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        model = BertModel.from_pretrained(tmp_path)
    text = " ".join(str(w.message) for w in caught)
    assert (
        "skipped 5 task-head tensors" in text and "cls.predictions.transform.dense.weight" in text
    )
    assert "no pooler weights" in text and "cls.predictions.bias" in caplog.text
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = mlm.bert(ids, attention_mask=mask, token_type_ids=types)
        out = model(ids, mask, types)
    assert_real_close(out.last_hidden_state, ref.last_hidden_state, mask)
    assert out.pooler_output is None


def _copy_with(tiny_checkpoint, tmp_path, edit):
    state = load_file(tiny_checkpoint / "model.safetensors")
    edit(state)
    (tmp_path / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    return tmp_path


def test_legacy_names_and_position_ids(tiny_checkpoint, tmp_path, hf_tiny):
    def edit(state):
        for k in [k for k in state if k.endswith("LayerNorm.weight")]:
            state[k.replace("LayerNorm.weight", "LayerNorm.gamma")] = state.pop(k)
        for k in [k for k in state if k.endswith("LayerNorm.bias")]:
            state[k.replace("LayerNorm.bias", "LayerNorm.beta")] = state.pop(k)
        state["embeddings.position_ids"] = torch.arange(TINY["max_position_embeddings"])[None]

    model = BertModel.from_pretrained(_copy_with(tiny_checkpoint, tmp_path, edit))
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf_tiny(ids, attention_mask=mask, token_type_ids=types)
        out = model(ids, mask, types)
    assert_real_close(out.last_hidden_state, ref.last_hidden_state, mask)


def test_missing_tensor(tiny_checkpoint, tmp_path):
    folder = _copy_with(
        tiny_checkpoint, tmp_path, lambda s: s.pop("encoder.layer.1.output.dense.bias")
    )
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(folder)
    msg = str(err.value)
    assert "missing tensors: encoder.layer.1.output.dense.bias" in msg
    assert str(folder / "model.safetensors") in msg


def test_unexpected_key(tiny_checkpoint, tmp_path):
    folder = _copy_with(
        tiny_checkpoint, tmp_path, lambda s: s.update({"encoder.extra.weight": torch.ones(3)})
    )
    with pytest.raises(ValueError, match=r"unexpected keys: encoder\.extra\.weight"):
        BertModel.from_pretrained(folder)


def test_wrong_shape(tiny_checkpoint, tmp_path):
    folder = _copy_with(
        tiny_checkpoint, tmp_path, lambda s: s.update({"pooler.dense.weight": torch.zeros(32, 31)})
    )
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(folder)
    msg = str(err.value)
    assert "tensors do not have the shapes config.json gives" in msg
    assert str(folder / "model.safetensors") in msg
    assert "pooler.dense.weight -> pooler.dense.weight (file (32, 31), model (32, 32))" in msg


def test_config_of_another_width_is_summarised(tiny_checkpoint, tmp_path):
    """A config.json of another model: one short line with the widths, not every tensor."""
    for f in tiny_checkpoint.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["hidden_size"] *= 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(tmp_path)
    msg = str(err.value)  # from the word table, before any module is built
    assert msg == (
        f"{tmp_path / 'config.json'}: hidden_size={config['hidden_size']} but "
        f"{tmp_path / 'model.safetensors'} has embeddings.word_embeddings.weight of shape "
        f"(99, 32): its vectors are 32 wide; use the config.json that came with these weights "
        f"(hidden_size=32)."
    )


def test_corrupt_bin_gives_no_unsafe_advice(tiny_checkpoint, tmp_path):
    (tmp_path / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02garbage that is no pickle" * 10)
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(tmp_path)
    msg = str(err.value)
    assert f"cannot read weights file {tmp_path / 'pytorch_model.bin'}" in msg
    assert "weights_only` set to `False`" not in msg and "file an issue" not in msg
    assert "truncated or corrupt" in msg and len(msg) < 400


def test_truncated_safetensors(tiny_checkpoint, tmp_path):
    data = (tiny_checkpoint / "model.safetensors").read_bytes()
    (tmp_path / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        BertModel.from_pretrained(tmp_path)
    assert f"cannot read weights file {tmp_path / 'model.safetensors'}" in str(err.value)
    assert "truncated or corrupt" in str(err.value)


def test_missing_folder_and_weights(tmp_path, tiny_checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no weights found; expected one of model"):
        BertModel.from_pretrained(tmp_path)


def test_key_maps_are_inverse(tiny_checkpoint):
    from bertattn.encoder.checkpoint import bertattn_to_hf_keys, hf_to_bertattn_keys

    config = BertConfig.from_json_file(tiny_checkpoint / "config.json")
    fwd, inv = hf_to_bertattn_keys(config), bertattn_to_hf_keys(config)
    assert {v: k for k, v in inv.items()} == fwd
    assert set(fwd.values()) == set(BertModel(config).state_dict())
    assert set(fwd) == set(load_file(tiny_checkpoint / "model.safetensors"))
    assert fwd["encoder.layer.1.attention.self.query.weight"] == (
        "encoder.layers.1.attn.q_linear.weight"
    )


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("position_embedding_type", "relative_key", "position_embedding_type='relative_key'"),
        ("is_decoder", True, "is_decoder=True is not supported"),
        ("add_cross_attention", True, "add_cross_attention=True is not supported"),
        ("hidden_act", "quick_gelu", "hidden_act='quick_gelu' is not supported"),
        (
            "model_type",
            "deberta",
            r"model_type=.deberta. is not supported.*.bert., .deberta-v2., .distilbert.",
        ),
        ("num_attention_heads", 5, r"hidden size \(32\) is not a multiple of the number of"),
        ("hidden_dropout_prob", 1.5, r"hidden_dropout_prob must be .*in \[0, 1\)"),
    ],
)
def test_config_refuses(tmp_path, key, value, message):
    data = {**TINY, "model_type": "bert", key: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as err:
        BertConfig.from_json_file(path)
    assert str(path) in str(err.value)


def test_config_ignores_harmless_keys():
    c = BertConfig.from_dict(
        {
            **TINY,
            "use_cache": True,
            "architectures": ["BertModel"],
            "position_embedding_type": "absolute",
            "is_decoder": False,
        }
    )
    assert c.hidden_size == 32 and c.head_dim == 8


# ---------------------------------------------------------------------- hub names
def _fake_cache(tmp_path, tiny_checkpoint):
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--org--tiny" / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (snap / name).write_bytes((tiny_checkpoint / name).read_bytes())
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text(commit)
    return cache


def test_hub_name_from_cache_offline(tmp_path, tiny_checkpoint, hf_tiny, monkeypatch):
    import huggingface_hub  # noqa: F401  (the hub path needs it)

    cache = _fake_cache(tmp_path, tiny_checkpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # "org/tiny" must not exist as a relative folder
    model = BertModel.from_pretrained("org/tiny")
    ids, mask, types = _batch()
    with torch.no_grad():
        ref = hf_tiny(ids, attention_mask=mask, token_type_ids=types)
        out = model(ids, mask, types)
    assert_real_close(out.last_hidden_state, ref.last_hidden_state, mask)
    with pytest.raises(FileNotFoundError) as err:
        BertModel.from_pretrained("bert-base-uncased")
    msg = str(err.value)
    assert "'bert-base-uncased' is not a local folder and is not in the Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE=1 forbids downloading" in msg and str(cache) in msg
