"""``attn_implementation="bertattn"`` on a model whose attention never goes through
transformers' ``AttentionInterface`` (MPNet computes it inline): transformers accepts the name
and runs its own attention, so bertattn warns, once per model class, naming why; a model that
does use the interface (BERT, RoBERTa) gets no such warning."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_integrations_families import SIZES  # noqa: E402

import bertattn  # noqa: E402
import bertattn.integrations.transformers as integration  # noqa: E402


def _saved(family: str, tmp_path) -> str:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(family, **SIZES)
    transformers.AutoModel.from_config(cfg).save_pretrained(tmp_path / family)
    return str(tmp_path / family)


def test_mpnet_warns_once_that_bertattn_never_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(integration, "_WARNED", set())
    path = _saved("mpnet", tmp_path)
    with pytest.warns(UserWarning) as caught:
        model = transformers.AutoModel.from_pretrained(path, attn_implementation="bertattn")
    ours = [w for w in caught if "never runs bertattn" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert "MPNetModel computes its attention inline" in message
    assert "bertattn.Bert.load(folder)" in message
    with bertattn.explain() as log:  # the reason: bertattn's function is indeed never called
        model(torch.tensor([[0, 5, 6, 2]]))
    assert log.records == []
    with warnings.catch_warnings():  # once per class: a second load says nothing more
        warnings.simplefilter("error", UserWarning)
        transformers.AutoModel.from_pretrained(path, attn_implementation="bertattn")


def test_a_model_on_the_interface_gets_no_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(integration, "_WARNED", set())
    path = _saved("roberta", tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = transformers.AutoModel.from_pretrained(path, attn_implementation="bertattn")
    assert not [w for w in caught if "never runs bertattn" in str(w.message)]
    with bertattn.explain() as log:
        model(torch.tensor([[0, 5, 6, 2]]))
    assert len(log.records) == SIZES["num_hidden_layers"]
