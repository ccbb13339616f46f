"""config.json fields a hostile round broke, each refused early as the folder's error
(:class:`ModelFolderError`, a ``ValueError``) in one line naming config.json and the field:

- sizes the tensors do not have (a million layers cost gigabytes before it was refused): checked
  against the weights' names and shapes before any module or key map is built;
- ``rope_parameters.<layer kind>`` as a list, string or number (an AttributeError traceback);
- a NaN or infinite ``rope_theta``, and a rotary head size that is odd."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from family_helpers import copy_with_config

from bertattn import Bert
from bertattn.encoder.config import BertConfig
from bertattn.errors import ModelFolderError


# ---------------------------------------------------------------------- sizes
def test_a_config_claiming_many_layers_is_refused_before_anything_is_built(
    tiny_checkpoint, tmp_path
):
    folder = copy_with_config(tiny_checkpoint, tmp_path / "deep", num_hidden_layers=20_000)
    tracemalloc.start()
    try:
        with pytest.raises(ModelFolderError) as err:
            Bert.load(folder, threads=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == (
        f"{folder / 'config.json'}: num_hidden_layers=20000 but {folder / 'model.safetensors'} "
        f"holds 2 layers (0 to 1); the config.json belongs to another model: use the one that "
        f"came with these weights (num_hidden_layers=2)."
    )
    # 20,000 layers' names and modules cost tens of MB (a million: GBs); the refusal, little
    assert peak < 8 << 20, peak


def test_a_width_the_embedding_table_does_not_have_is_refused_by_field(tiny_checkpoint, tmp_path):
    folder = copy_with_config(tiny_checkpoint, tmp_path / "wide", hidden_size=64)
    with pytest.raises(ModelFolderError) as err:
        Bert.load(folder, threads=1)
    assert str(err.value) == (
        f"{folder / 'config.json'}: hidden_size=64 but {folder / 'model.safetensors'} has "
        f"embeddings.word_embeddings.weight of shape (99, 32): its vectors are 32 wide; use the "
        f"config.json that came with these weights (hidden_size=32)."
    )


def test_fewer_layers_claimed_is_still_the_tensor_list(tiny_checkpoint, tmp_path):
    """One layer claimed of two: the unexpected tensors are listed, as before (bounded by the
    file's own tensors)."""
    folder = copy_with_config(tiny_checkpoint, tmp_path / "shallow", num_hidden_layers=1)
    with pytest.raises(ModelFolderError, match=r"unexpected keys: .*encoder\.layer\.1\."):
        Bert.load(folder, threads=1)


# ---------------------------------------------------------------------- rotary settings
MODERN = {
    "model_type": "modernbert", "vocab_size": 99, "hidden_size": 36, "num_hidden_layers": 3,
    "num_attention_heads": 3, "intermediate_size": 40, "max_position_embeddings": 64,
    "local_attention": 8, "pad_token_id": 0,
}  # fmt: skip
ROTARY = {
    "model_type": "gte", "vocab_size": 99, "hidden_size": 36, "num_hidden_layers": 3,
    "num_attention_heads": 3, "intermediate_size": 40, "max_position_embeddings": 64,
    "pad_token_id": 0,
}  # fmt: skip


def _read(tmp_path: Path, data: dict) -> BertConfig:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    return BertConfig.from_json_file(path)


def test_the_stand_in_configs_load(tmp_path):
    assert _read(tmp_path, MODERN).arch.theta == {"full_attention": 160_000.0,
                                                  "sliding_attention": 10_000.0}  # fmt: skip
    assert _read(tmp_path, {**ROTARY, "rope_theta": 5000}).arch.theta == 5000.0
    rotary = {**ROTARY, "rope_parameters": {"rope_type": "default", "rope_theta": 7e3}}
    assert _read(tmp_path, rotary).arch.theta == 7000.0
    modern = {**MODERN, "rope_parameters": {"full_attention": {"rope_theta": 5e5}}}
    assert _read(tmp_path, modern).arch.theta["full_attention"] == 5e5


@pytest.mark.parametrize("value", [[10000.0], "10000", 10000, True])
def test_a_rope_parameters_entry_that_is_not_an_object_is_refused(tmp_path, value):
    data = {**MODERN, "rope_parameters": {"sliding_attention": value}}
    with pytest.raises(ModelFolderError) as err:
        _read(tmp_path, data)
    assert str(err.value) == (
        f"{tmp_path / 'config.json'}: rope_parameters.sliding_attention={value!r} is not "
        f"supported; bertattn loads ModernBERT checkpoints with a dict with rope_type and "
        f"rope_theta."
    )


@pytest.mark.parametrize("value", [[1], "x", 3])
def test_rope_parameters_that_is_not_an_object_is_refused(tmp_path, value):
    for base, what in ((MODERN, "a dict per layer type"),
                       (ROTARY, "a dict with rope_type and rope_theta")):  # fmt: skip
        with pytest.raises(ModelFolderError) as err:
            _read(tmp_path, {**base, "rope_parameters": value})
        assert str(err.value).startswith(
            f"{tmp_path / 'config.json'}: rope_parameters={value!r} is not supported"
        )
        assert str(err.value).endswith(f"checkpoints with {what}.")


NOT_FINITE = [float("nan"), float("inf"), float("-inf"), 0.0, -5.0]


@pytest.mark.parametrize("theta", NOT_FINITE, ids=["nan", "inf", "-inf", "zero", "negative"])
@pytest.mark.parametrize(
    ("base", "changes", "field"),
    [
        (MODERN, lambda t: {"rope_parameters": {"full_attention": {"rope_theta": t}}},
         "rope_parameters.full_attention.rope_theta"),
        (MODERN, lambda t: {"global_rope_theta": t}, "global_rope_theta"),
        (ROTARY, lambda t: {"rope_theta": t}, "rope_theta"),
        (ROTARY, lambda t: {"rope_parameters": {"rope_theta": t}}, "rope_parameters.rope_theta"),
    ],
    ids=["modern", "modern-old", "rotary", "rotary-params"],
)  # fmt: skip
def test_a_rope_theta_that_is_not_a_finite_positive_number_is_refused(
    tmp_path, base, changes, field, theta
):
    with pytest.raises(ModelFolderError) as err:
        _read(tmp_path, {**base, **changes(theta)})
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: {field}={theta!r} is not supported")
    assert message.endswith("with a finite number > 0 (e.g. 10000.0).")
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("base", [MODERN, ROTARY], ids=["modern", "rotary"])
def test_an_odd_rotary_head_size_is_refused_naming_the_field(tmp_path, base):
    with pytest.raises(ModelFolderError) as err:
        _read(tmp_path, {**base, "hidden_size": 30, "num_attention_heads": 2})
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: num_attention_heads=2 is not supported")
    assert message.endswith(
        "an even head size (rotary positions pair dimension i with i + head_size/2): "
        "hidden_size / num_attention_heads = 30 / 2 = 15 is odd."
    )
