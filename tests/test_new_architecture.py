"""The checklist for adding an architecture (docs/development.md), done from a test: a family
record registered from outside ``src/bertattn/families/`` (here BERT's layers under other tensor
names and another ``model_type``) makes such a folder load, encode and run through the command
line, with no other file of the library touched."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from bertattn import Bert
from bertattn.families import registry

TOY = "toy_encoder"


def _toy_rename(state: dict[str, torch.Tensor], config: object) -> dict[str, torch.Tensor]:
    """The toy checkpoint's names (``toy.`` for ``bert.``-less BERT names) back to BERT's."""
    return {k.removeprefix("toy."): v for k, v in state.items()}


@pytest.fixture
def toy_family(monkeypatch) -> registry.Family:
    bert = registry.get("bert")
    toy = dataclasses.replace(
        bert,
        name=TOY,
        title="Toy encoder",
        rename=lambda state, config: bert.rename(_toy_rename(state, config), config),
    )
    monkeypatch.setattr(registry, "_REGISTRY", {**registry._REGISTRY})  # undone after
    monkeypatch.setattr(registry, "_ALIASES", {**registry._ALIASES})
    return registry.register(toy, "toy-encoder")


@pytest.fixture
def toy_folder(tiny_checkpoint, tmp_path):
    folder = tmp_path / "toy"
    shutil.copytree(tiny_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "toy-encoder"
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    renamed = {f"toy.{k}": v.contiguous() for k, v in weights.items()}
    save_file(renamed, folder / "model.safetensors")
    return folder


def test_a_registered_record_loads_its_folder(toy_family, toy_folder, tiny_checkpoint) -> None:
    texts = ["a toy architecture", "registered from a test"]
    toy = Bert.load(toy_folder)
    assert toy.model.config.family == TOY
    want = Bert.load(tiny_checkpoint).encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(toy.encode(texts, convert_to_tensor=True), want, rtol=0, atol=0)


def test_an_unregistered_model_type_is_refused_by_name(toy_folder) -> None:
    with pytest.raises(Exception, match=r"model_type='toy-encoder' is not supported"):
        Bert.load(toy_folder)


def test_the_command_line_runs_it(toy_family, toy_folder, cli, tmp_path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one line\nanother line\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    r = cli("encode", src, "-o", out, "--model", toy_folder)
    assert r.code == 0, r
    assert np.load(out).shape[0] == 2
