"""Text summary, argument validation, render_all."""

from __future__ import annotations

import json

import numpy as np
import pytest
from viz_data import softmax_maps

from bertattn.maps import AttentionMaps
from bertattn.viz import check_layer_head, render_all, summary


def test_summary_lists_tokens_and_top3_per_query():
    w = np.array(
        [
            [0.1, 0.2, 0.3, 0.4],
            [0.7, 0.1, 0.15, 0.05],
            [0.25, 0.25, 0.25, 0.25],
            [0.0, 0.0, 0.0, 1.0],
        ],
        dtype=np.float32,
    )
    maps = AttentionMaps(["[CLS]", "the", "cat", "[SEP]"], [np.stack([w, w.T])], model_name="m")
    text = summary(maps, layer=0, head=0)
    lines = text.splitlines()
    assert lines[0] == "m, layer 0, head 0: 4 tokens, top 3 keys per query"
    assert lines[1] == "tokens: 0:[CLS] 1:the 2:cat 3:[SEP]"
    assert lines[2] == "0 [CLS] -> [SEP] 0.400 | cat 0.300 | the 0.200"
    assert lines[3] == "1 the   -> [CLS] 0.700 | cat 0.150 | the 0.100"
    assert lines[4] == "2 cat   -> [CLS] 0.250 | the 0.250 | cat 0.250"  # ties: token order
    assert lines[5].startswith("3 [SEP] -> [SEP] 1.000 | ")
    assert len(lines) == 6
    assert summary(maps, layer=0, head=0, top=1).splitlines()[2] == "0 [CLS] -> [SEP] 0.400"


def test_layer_out_of_range_message():
    maps = softmax_maps(3, 6, 2)
    with pytest.raises(ValueError) as e:
        summary(maps, layer=9, head=0)
    assert str(e.value) == "layer 9 is out of range: this model has layers 0..5"
    with pytest.raises(ValueError, match=r"^layer -1 is out of range"):
        check_layer_head(maps, -1, 0)


def test_head_out_of_range_message():
    maps = softmax_maps(3, 2, 12)
    with pytest.raises(ValueError) as e:
        summary(maps, layer=1, head=12)
    assert str(e.value) == "head 12 is out of range: this model has heads 0..11"


def test_non_contiguous_layers_are_listed():
    maps = softmax_maps(3, 2, 2, layer_ids=[0, 5])
    with pytest.raises(ValueError, match="this model has layers 0, 5$"):
        check_layer_head(maps, 3, 0)
    assert check_layer_head(maps, 5, 1) == 1


def test_render_all_checks_first_and_writes_nothing(tmp_path):
    maps = softmax_maps(4, 2, 2)
    with pytest.raises(ValueError, match="layer 7 is out of range"):
        render_all(maps, html=tmp_path / "a.html", json_path=tmp_path / "a.json", layer=7)
    assert list(tmp_path.iterdir()) == []


def test_render_all_writes_json_that_loads_back(tmp_path):
    maps = softmax_maps(5, 2, 3, seed=4, model_name="syn")
    out = render_all(maps, json_path=tmp_path / "m.json", html=tmp_path / "m.html", rollout=True)
    assert out == [tmp_path / "m.html", tmp_path / "m.json"]
    data = json.loads((tmp_path / "m.json").read_text())
    back = AttentionMaps.from_dict(data)
    assert back.tokens == maps.tokens and back.model_name == "syn"
    np.testing.assert_allclose(back.layers[1], maps.layers[1], atol=1e-6)
    np.testing.assert_allclose(np.sum(data["rollout"], axis=-1), 1.0, atol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.html", "m.json"]


def test_summary_explains_subword_marks_and_aligns_cjk():
    """One line under the tokens says what their mark means; CJK tokens take two columns."""
    import unicodedata

    def width(text: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    tokens = ["[CLS]", "中国", "tired", "##ness", "[SEP]"]
    w = np.full((5, 5), 0.2, dtype=np.float32)
    lines = summary(AttentionMaps(tokens, [w[None]]), layer=0, head=0).splitlines()
    assert lines[2] == (
        "“##” marks a piece that continues the word before it (WordPiece): tired ##ness are "
        "one word, tiredness."
    )
    arrows = {width(line[: line.index(" -> ")]) for line in lines[3:]}
    assert arrows == {len("0 ##ness")}, lines
    pieces = ["<s>", "▁", "一只", "猫", "</s>"]
    lines = summary(AttentionMaps(pieces, [w[None]]), layer=0, head=0).splitlines()
    assert lines[2].startswith("“▁” marks a token that starts a word")
    plain = summary(AttentionMaps(["[CLS]", "cat", "[SEP]"], [w[None, :3, :3]]), layer=0, head=0)
    assert "marks" not in plain
