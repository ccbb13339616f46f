"""The rotary families' folders as the hub keeps them, for their remote code: GTE's
``"model_type": "new"`` (``NewConfig``'s fields, ``NewModel``'s fused tensors), the same folder
under ``"model_type": "gte"`` (snowflake-arctic-embed-m-v2.0) and NomicBERT's
GPT-2-style config (``n_embd``, ``n_head``, ...). Each folder is written here with exactly
those field and tensor names, from the weights of a random folder of transformers' native
class, and must give the hidden states of that native folder (within 1e-6)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from family_helpers import padded_batch
from safetensors.torch import save_file
from tiny_bert import save_random

from bertattn import BertModel
from bertattn.errors import ModelFolderError

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
    intermediate_size=29, max_position_embeddings=300, pad_token_id=0,
)  # fmt: skip


def _batch() -> dict[str, torch.Tensor]:
    """Three padded rows, ``(3, 40)`` ids and mask."""
    ids, mask = padded_batch([40, 7, 23], seed=4)
    return {"input_ids": ids, "attention_mask": mask}


def _hidden(folder: Path, backend: str = "math") -> torch.Tensor:
    batch = _batch()
    with torch.no_grad():
        out = BertModel.from_pretrained(folder, backend=backend)(**batch).last_hidden_state
    return out[batch["attention_mask"].bool()]  # (real tokens, E)


def _write(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


# ---------------------------------------------------------------------- GTE's "new"
def _new_config(**changes: object) -> dict:
    """A ``NewConfig`` as gte-multilingual-base's config.json writes it (its field names; the
    sizes tiny)."""
    config = {
        "architectures": ["NewModel"],
        "auto_map": {"AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
                     "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"},
        "model_type": "new",
        "vocab_size": 99, "hidden_size": 36, "num_hidden_layers": 3, "num_attention_heads": 3,
        "intermediate_size": 29, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 300,
        "type_vocab_size": 1, "initializer_range": 0.02, "layer_norm_type": "layer_norm",
        "layer_norm_eps": 1e-12, "position_embedding_type": "rope", "rope_theta": 160000.0,
        "rope_scaling": None, "classifier_dropout": None, "pack_qkv": True,
        "unpad_inputs": False, "use_memory_efficient_attention": False,
        "logn_attention_scale": False, "logn_attention_clip1": False, "pad_token_id": 0,
    }  # fmt: skip
    config.update(changes)
    return config


def _new_tensors(native: dict[str, torch.Tensor], pack_qkv: bool) -> dict[str, torch.Tensor]:
    """transformers' ``GteModel`` tensors under ``NewModel``'s names: ``encoder.layer.N.``,
    ``attention.qkv_proj`` (q, k, v stacked on the output axis) or ``attention.{q,k,v}_proj``,
    ``attention.o_proj``, ``mlp.up_gate_proj`` (up first, then the gate), ``mlp.down_proj``,
    ``attn_ln``, ``mlp_ln``."""
    out = {k: v for k, v in native.items() if k.startswith("embeddings.")}
    layers = {int(k.split(".")[1]) for k in native if k.startswith("layers.")}
    for i in sorted(layers):
        src, dst = f"layers.{i}.", f"encoder.layer.{i}."
        for p in ("weight", "bias"):
            parts = [native[f"{src}self_attn.{x}_proj.{p}"] for x in "qkv"]
            if pack_qkv:
                out[f"{dst}attention.qkv_proj.{p}"] = torch.cat(parts, dim=0)
            else:
                for x, part in zip("qkv", parts, strict=True):
                    out[f"{dst}attention.{x}_proj.{p}"] = part
            out[f"{dst}attention.o_proj.{p}"] = native[f"{src}self_attn.o_proj.{p}"]
            out[f"{dst}mlp.down_proj.{p}"] = native[f"{src}mlp.down_proj.{p}"]
            out[f"{dst}attn_ln.{p}"] = native[f"{src}post_attention_layernorm.{p}"]
            out[f"{dst}mlp_ln.{p}"] = native[f"{src}post_mlp_layernorm.{p}"]
        up, gate = native[f"{src}mlp.up_proj.weight"], native[f"{src}mlp.gate_proj.weight"]
        out[f"{dst}mlp.up_gate_proj.weight"] = torch.cat([up, gate], dim=0)
    return out


def _native(where: Path, name: str, seed: int, **fields: object) -> tuple[Path, torch.nn.Module]:
    """A random transformers ``{name}Model`` of :data:`SIZES` and ``fields`` saved in
    ``where``."""
    import transformers

    config = getattr(transformers, f"{name}Config")(**SIZES, **fields)
    return where, save_random(getattr(transformers, f"{name}Model"), config, where, seed)


@pytest.fixture(scope="module")
def gte_native(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A random ``GteModel`` folder (one token-type row, as gte-multilingual-base)."""
    return _native(tmp_path_factory.mktemp("gte-native"), "Gte", 7, type_vocab_size=1)


@pytest.mark.parametrize("pack_qkv", [True, False])
def test_a_new_folder_equals_the_native_gte_folder(gte_native, tmp_path, pack_qkv) -> None:
    folder, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    new = _write(tmp_path / "new", _new_config(pack_qkv=pack_qkv), _new_tensors(native, pack_qkv))
    assert "encoder.layer.0.mlp.up_gate_proj.weight" in _new_tensors(native, pack_qkv)
    assert BertModel.from_pretrained(new).config.family == "gte"
    torch.testing.assert_close(_hidden(new), _hidden(folder), atol=1e-6, rtol=0)
    batch = _batch()
    with torch.no_grad():
        want = hf(**batch).last_hidden_state[batch["attention_mask"].bool()]
    torch.testing.assert_close(_hidden(new, "sdpa"), want, atol=1e-5, rtol=1e-5)


def test_a_new_folder_without_rope_theta_rotates_with_newconfig_default(gte_native, tmp_path):
    """``NewConfig``'s ``rope_theta`` default is 10,000 (``GteConfig``'s 160,000)."""
    import transformers

    _, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    config = _new_config()
    del config["rope_theta"]
    new = _write(tmp_path / "new", config, _new_tensors(native, True))
    ref = tmp_path / "ref"
    gte = transformers.GteConfig(**SIZES, type_vocab_size=1, rope_theta=10_000.0)
    model = transformers.GteModel(gte).eval()
    model.load_state_dict(native)
    model.save_pretrained(ref)
    torch.testing.assert_close(_hidden(new), _hidden(ref), atol=1e-6, rtol=0)
    assert not torch.allclose(_hidden(new), _hidden(gte_native[0]), atol=1e-3)


@pytest.mark.parametrize(
    ("field", "value"),
    [("position_embedding_type", "absolute"), ("layer_norm_type", "rms_norm"),
     ("logn_attention_scale", True)],
)  # fmt: skip
def test_new_switches_bertattn_does_not_run_are_refused(gte_native, tmp_path, field, value):
    _, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    bad = _write(tmp_path / "bad", _new_config(**{field: value}), _new_tensors(native, True))
    with pytest.raises(ModelFolderError, match=rf"{field}={value!r} is not supported.*"
                       rf"{field}="):  # fmt: skip
        BertModel.from_pretrained(bad)


# ---------------------------------------------------------------------- arctic-embed's "gte"
def _arctic_config(**changes: object) -> dict:
    """snowflake-arctic-embed-m-v2.0's config.json: ``NewConfig``'s fields under
    ``"model_type": "gte"`` with ``GteModel`` as its architecture and the remote code in its
    ``auto_map`` (the sizes tiny)."""
    return _new_config(architectures=["GteModel"], model_type="gte", unpad_inputs=True,
                       use_memory_efficient_attention=True, classifier_dropout=0.1,
                       **changes)  # fmt: skip


@pytest.mark.parametrize("pack_qkv", [True, False])
def test_a_gte_folder_of_newmodel_names_equals_the_native_folder(gte_native, tmp_path, pack_qkv):
    """The folder loads as GTE and gives the native folder's hidden states; transformers'
    own ``GteModel.from_pretrained`` reads the same folder to the same hidden states."""
    import transformers

    folder, _ = gte_native
    native = {k: v.detach() for k, v in gte_native[1].state_dict().items()}
    tensors = _new_tensors(native, pack_qkv)
    arctic = _write(tmp_path / "arctic", _arctic_config(pack_qkv=pack_qkv), tensors)
    assert BertModel.from_pretrained(arctic).config.family == "gte"
    torch.testing.assert_close(_hidden(arctic), _hidden(folder), atol=1e-6, rtol=0)
    if pack_qkv:  # transformers' conversion splits the packed projection only
        hf = transformers.GteModel.from_pretrained(arctic).eval()
        batch = _batch()
        with torch.no_grad():
            want = hf(**batch).last_hidden_state[batch["attention_mask"].bool()]
        torch.testing.assert_close(_hidden(arctic, "sdpa"), want, atol=1e-5, rtol=1e-5)


def test_a_gte_folder_with_ntk_scaling_equals_the_native_names(gte_native, tmp_path) -> None:
    """With ``rope_scaling`` ntk the ``gte`` folder equals the same weights under the native
    names and the same config."""
    folder, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    scaling = {"type": "ntk", "factor": 8.0}
    arctic = _write(tmp_path / "arctic", _arctic_config(rope_scaling=scaling),
                    _new_tensors(native, True))  # fmt: skip
    ref = tmp_path / "ref"
    ref.mkdir()
    config = json.loads((folder / "config.json").read_text()) | {"rope_scaling": scaling}
    (ref / "config.json").write_text(json.dumps(config))
    (ref / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    torch.testing.assert_close(_hidden(arctic), _hidden(ref), atol=1e-6, rtol=0)
    assert not torch.allclose(_hidden(arctic), _hidden(folder), atol=1e-3)


# ---------------------------------------------------------------------- NomicBERT's names
def _nomic_config(**changes: object) -> dict:
    """The remote code's ``NomicBertConfig`` as nomic-embed-text-v1.5's config.json writes it
    (GPT-2's field names; the sizes tiny)."""
    code = "nomic-ai/nomic-bert-2048--"
    config = {
        "architectures": ["NomicBertModel"],
        "auto_map": {"AutoConfig": f"{code}configuration_hf_nomic_bert.NomicBertConfig",
                     "AutoModel": f"{code}modeling_hf_nomic_bert.NomicBertModel"},
        "model_type": "nomic_bert",
        "activation_function": "swiglu", "attn_pdrop": 0.0, "bos_token_id": None,
        "causal": False, "dense_seq_output": True, "embd_pdrop": 0.0, "eos_token_id": None,
        "fused_bias_fc": True, "fused_dropout_add_ln": True, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-12, "max_trained_positions": 2048, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "n_embd": 36, "n_head": 3, "n_inner": 29, "n_layer": 3,
        "n_positions": 300, "pad_vocab_size_multiple": 1, "parallel_block": False,
        "parallel_block_tied_norm": False, "prenorm": False, "qkv_proj_bias": False,
        "reorder_and_upcast_attn": False, "resid_pdrop": 0.0, "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
        "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
        "summary_activation": None, "summary_first_dropout": 0.0, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True, "type_vocab_size": 2,
        "use_cache": True, "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True,
        "vocab_size": 99,
    }  # fmt: skip
    config.update(changes)
    return config


def _nomic_tensors(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' ``NomicBertModel`` tensors under the remote code's names: ``emb_ln``,
    ``encoder.layers.N.attn.Wqkv`` (q, k, v stacked), ``attn.out_proj``, ``mlp.fc11`` (up),
    ``mlp.fc12`` (the gate), ``mlp.fc2``, ``norm1``, ``norm2``."""
    out = {k: v for k, v in native.items() if k.startswith("embeddings.") and "LayerNorm" not in k}
    out.update({f"emb_ln.{p}": native[f"embeddings.LayerNorm.{p}"] for p in ("weight", "bias")})
    layers = {int(k.split(".")[1]) for k in native if k.startswith("layers.")}
    for i in sorted(layers):
        src, dst = f"layers.{i}.", f"encoder.layers.{i}."
        qkv = [native[f"{src}self_attn.{x}_proj.weight"] for x in "qkv"]
        out[f"{dst}attn.Wqkv.weight"] = torch.cat(qkv, dim=0)
        out[f"{dst}attn.out_proj.weight"] = native[f"{src}self_attn.o_proj.weight"]
        for theirs, ours in (("fc11", "up_proj"), ("fc12", "gate_proj"), ("fc2", "down_proj")):
            out[f"{dst}mlp.{theirs}.weight"] = native[f"{src}mlp.{ours}.weight"]
        for p in ("weight", "bias"):
            out[f"{dst}norm1.{p}"] = native[f"{src}post_attention_layernorm.{p}"]
            out[f"{dst}norm2.{p}"] = native[f"{src}post_mlp_layernorm.{p}"]
    return out


@pytest.fixture(scope="module")
def nomic_native(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A random ``NomicBertModel`` folder (rotary base 1,000, as nomic-embed-text-v1.5)."""
    return _native(tmp_path_factory.mktemp("nomic-native"), "NomicBert", 8, rope_theta=1000.0)


@pytest.mark.parametrize(
    "changes",
    [{}, {"vocab_size": 97, "pad_vocab_size_multiple": 33}],  # the word table: 99 rows
    ids=["as-released", "padded-vocabulary"],
)
def test_a_remote_nomic_folder_equals_the_native_folder(nomic_native, tmp_path, changes) -> None:
    folder, hf = nomic_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    remote = _write(tmp_path / "remote", _nomic_config(**changes), _nomic_tensors(native))
    model = BertModel.from_pretrained(remote)
    assert (model.config.hidden_size, model.config.num_attention_heads) == (36, 3)
    assert (model.config.num_hidden_layers, model.config.intermediate_size) == (3, 29)
    torch.testing.assert_close(_hidden(remote), _hidden(folder), atol=1e-6, rtol=0)
    batch = _batch()
    with torch.no_grad():
        want = hf(**batch).last_hidden_state[batch["attention_mask"].bool()]
    torch.testing.assert_close(_hidden(remote, "sdpa"), want, atol=1e-5, rtol=1e-5)


def test_the_remote_rotary_base_is_read(nomic_native, tmp_path) -> None:
    """``rotary_emb_base`` is the rotation's base: another one gives other hidden states."""
    folder, hf = nomic_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    remote = _write(tmp_path / "r", _nomic_config(rotary_emb_base=10_000), _nomic_tensors(native))
    assert not torch.allclose(_hidden(remote), _hidden(folder), atol=1e-3)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("rotary_emb_fraction", 0.5, "rotary_emb_fraction=1.0"),
     ("rotary_emb_interleaved", True, "rotary_emb_interleaved=false"),
     ("rotary_scaling_factor", 2.0, "rotary_scaling_factor=null"),
     ("prenorm", True, "prenorm=false"),
     ("qkv_proj_bias", True, "qkv_proj_bias=false"),
     ("activation_function", "gelu", "activation_function='swiglu'")],
)  # fmt: skip
def test_remote_switches_bertattn_does_not_run_are_refused(
    nomic_native, tmp_path, field, value, expected
) -> None:
    _, hf = nomic_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    bad = _write(tmp_path / "bad", _nomic_config(**{field: value}), _nomic_tensors(native))
    message = f"{field}={value!r} is not supported; bertattn loads NomicBERT checkpoints with "
    with pytest.raises(ModelFolderError, match=re.escape(message + expected + ".")):
        BertModel.from_pretrained(bad)


# ---------------------------------------------------------------------- GTE's ntk scaling
def _ntk_reference(head_dim: int, theta: float, factor: float, mixed_b: float | None) -> list:
    """The remote code's NTK frequencies written out pair by pair, in float64: fixed, the
    base times s and every frequency over s^(2/D); mixed, pair i over
    exp(ln(s) / (D/2)^b * (i+1)^b)."""
    freqs = []
    for i in range(head_dim // 2):
        if mixed_b is None:
            freqs.append((theta * factor) ** (-2 * i / head_dim) / factor ** (2 / head_dim))
        else:
            lam = math.exp(math.log(factor) / (head_dim / 2) ** mixed_b * (i + 1) ** mixed_b)
            freqs.append(theta ** (-2 * i / head_dim) / lam)
    return freqs


@pytest.mark.parametrize("mixed_b", [None, 0.625])
def test_ntk_frequencies_equal_the_formula(mixed_b) -> None:
    from bertattn.blocks.rotary import NtkScaling

    got = NtkScaling(2.0, mixed_b).inverse_frequencies(12, 160_000.0, torch.device("cpu"))
    want = torch.tensor(_ntk_reference(12, 160_000.0, 2.0, mixed_b), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    plain = NtkScaling(1.0, mixed_b).inverse_frequencies(12, 160_000.0, torch.device("cpu"))
    torch.testing.assert_close(plain.double(), _plain(12, 160_000.0), rtol=1e-6, atol=0)
    assert not torch.allclose(got.double(), plain.double(), rtol=1e-3)


def _plain(head_dim: int, theta: float) -> torch.Tensor:
    return torch.tensor([theta ** (-2 * i / head_dim) for i in range(head_dim // 2)],
                        dtype=torch.float64)  # fmt: skip


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen"])
@pytest.mark.parametrize("mixed_b", [None, 0.625])
def test_an_ntk_scaled_gte_equals_the_formula(gte_native, tmp_path, backend, mixed_b) -> None:
    """A ``new`` folder with ``rope_scaling`` ntk against transformers' ``GteModel`` on the same
    weights with its rotary frequencies replaced by :func:`_ntk_reference`'s."""
    _, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    scaling = {"type": "ntk", "factor": 2.0} | ({} if mixed_b is None else {"mixed_b": mixed_b})
    new = _write(tmp_path / "ntk", _new_config(rope_scaling=scaling), _new_tensors(native, True))
    freqs = _ntk_reference(12, 160_000.0, 2.0, mixed_b)
    hf.rotary_emb.inv_freq = torch.tensor(freqs, dtype=torch.float32)
    batch = _batch()
    keep = batch["attention_mask"].bool()
    try:
        with torch.no_grad():
            want = hf(**batch).last_hidden_state[keep]
    finally:
        hf.rotary_emb.inv_freq = hf.rotary_emb.original_inv_freq.clone()
    torch.testing.assert_close(_hidden(new, backend), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_hidden(gte_native[0], backend), want, atol=1e-3)


@pytest.mark.parametrize(
    ("scaling", "field", "expected"),
    [({"type": "linear", "factor": 2.0}, "rope_scaling",
      'rope_scaling null or {"type": "ntk", "factor": a number >= 1}'),
     ({"type": "ntk", "factor": 0.5}, "rope_scaling.factor", "a finite number >= 1 (e.g. 2.0)"),
     ({"type": "ntk", "factor": 2.0, "mixed_b": -1}, "rope_scaling.mixed_b",
      "null or a finite number > 0 (e.g. 0.625)")],
)  # fmt: skip
def test_other_rope_scalings_are_refused(gte_native, tmp_path, scaling, field, expected) -> None:
    _, hf = gte_native
    native = {k: v.detach() for k, v in hf.state_dict().items()}
    bad = _write(tmp_path / "bad", _new_config(rope_scaling=scaling), _new_tensors(native, True))
    value = {"rope_scaling": scaling}.get(field, scaling.get(field.split(".")[-1]))
    message = f"{field}={value!r} is not supported; bertattn loads GTE checkpoints with {expected}."
    with pytest.raises(ModelFolderError, match=re.escape(message)):
        BertModel.from_pretrained(bad)


def test_nomic_refuses_an_ntk_scaling(nomic_native, tmp_path) -> None:
    """NTK scaling is GTE's remote code's; NomicBERT's folders carry none."""
    folder, _ = nomic_native
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"type": "ntk", "factor": 2.0}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(ModelFolderError, match=r"rope_scaling=.* is not supported.*null"):
        BertModel.from_pretrained(bad)
