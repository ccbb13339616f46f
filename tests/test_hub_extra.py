"""Hub names need ``huggingface-hub``: it is the ``hub`` extra (``pip install "bertattn[hub]"``),
the README's install lines name it, and a hub name asked without it is refused naming the
extra, not a bare package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bertattn.encoder.folder import locate_model
from bertattn.errors import ModelFolderError

ROOT = Path(__file__).resolve().parents[1]


def test_hub_is_an_extra_named_in_the_readme():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    hub = project["optional-dependencies"]["hub"]
    assert any(req.startswith("huggingface-hub") for req in hub), hub
    assert 'pip install ".[hub]"' in (ROOT / "README.md").read_text(encoding="utf-8")


def test_a_hub_name_without_huggingface_hub_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no local folder of that name
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ModelFolderError) as info:
        locate_model("cross-encoder/ms-marco-MiniLM-L6-v2")
    message = str(info.value)
    assert "'cross-encoder/ms-marco-MiniLM-L6-v2'" in message
    assert 'pip install "bertattn[hub]"' in message
