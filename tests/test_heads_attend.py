"""``bertattn attend`` on a classifier or reranker: the attention of its own encoder, and what
its head decided (a reranker's score, a classifier's label and probability) in the summary and
in the titles of the page and the picture, equal to the Python API's answer."""

from __future__ import annotations

import json

import pytest
from test_heads_cross_encoder import save_classifier
from test_heads_pipelines import sentiment  # noqa: F401  (a fixture: 3 labels)

import bertattn
from bertattn import CrossEncoder


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr"), 1, seed=3)


def test_attend_on_a_reranker_shows_its_score(cli, reranker, tmp_path):
    text, pair = "the attention head", "looks at every token"
    want = float(CrossEncoder(reranker).predict((text, pair)))
    r = cli("attend", text, "--pair", pair, "--model", reranker)
    assert r.code == 0, r
    assert f"the model's head decided: score {want:.3f}" in r.out
    out = tmp_path / "a.json"
    page = tmp_path / "a.html"
    r = cli("attend", text, "--pair", pair, "--model", reranker, "--json", out, "--html", page)
    assert r.code == 0, r
    assert json.loads(out.read_text())["model_name"].endswith(f"score {want:.3f}")
    assert f"score {want:.3f}" in page.read_text(encoding="utf-8")


def test_attend_on_a_classifier_shows_its_label(cli, sentiment):  # noqa: F811
    text = "hello world"
    best = bertattn.pipeline("text-classification", sentiment)(text)[0]
    r = cli("attend", text, "--model", sentiment)
    assert r.code == 0, r
    assert f"the model's head decided: {best['label']} {best['score']:.3f}" in r.out


def test_attend_on_an_encoder_says_nothing_of_a_head(cli, tiny_checkpoint):
    r = cli("attend", "hello world", "--model", tiny_checkpoint)
    assert r.code == 0, r
    assert "decided" not in r.out
