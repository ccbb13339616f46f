"""Every job on Gemma 3 (EmbeddingGemma's family): the article's steps of a sliding layer (the
shared key/value head, the q/k norm, Gemma's scale and the window, each its own line, in
English and Chinese) against transformers' eager attention; ``attend`` (the page says there is
no steps view, ``--explain`` prints the steps); ``encode`` of a corpus file, ``serve``'s
``/v1/embeddings`` and the Python rows on the sentence-transformers folder with its Dense
modules; the ONNX export refused by the family's name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_family_gemma3 import tiny  # noqa: F401  (a fixture)
from test_family_gemma3_encode import TEXTS, gemma_st  # noqa: F401  (gemma_st: a fixture)

from bertattn import Bert

TEXT = "the attention head looks at every token of it"


def test_steps_of_a_sliding_layer_equal_transformers_eager_attention(tiny) -> None:  # noqa: F811
    """Layer 0 is sliding (reach 5), head 2 reads key/value head 0; the weights equal
    transformers' eager attention, the scaled scores are the scores times 20 ** -0.5, and the
    keys before the rotation are the normed key/value head's."""
    import transformers

    folder, _ = tiny
    bert = Bert.load(folder, threads=1)
    steps = bert.attention_steps(TEXT, layer=0, head=2, query=3)
    assert (steps.heads, steps.kv_heads, steps.qk_norm) == (3, 1, True)
    assert steps.window == 5 and steps.theta == 100.0
    torch.testing.assert_close(steps.scale, 20**-0.5)
    torch.testing.assert_close(steps.scaled, steps.scores * 20**-0.5, atol=1e-6, rtol=1e-6)
    ids = torch.tensor([bert.tokenizer.encode_batch([TEXT])[0].ids])
    theirs = transformers.Gemma3TextModel.from_pretrained(folder, attn_implementation="eager")
    with torch.no_grad():
        want = theirs.eval()(ids, output_attentions=True).attentions[0][0, 2, 3]
    torch.testing.assert_close(steps.weights, want, atol=1e-6, rtol=1e-5)
    outside = (torch.arange(len(steps.tokens)) - 3).abs() > 5
    assert outside.any() and torch.all(steps.weights[outside] == 0)
    # the keys before the rotation: every query head's are the one key/value head's
    other = bert.attention_steps(TEXT, layer=0, head=0, query=3)
    torch.testing.assert_close(other.k_before, steps.k_before)


def test_the_formula_names_each_change_in_both_languages(tiny) -> None:  # noqa: F811
    folder, _ = tiny
    steps = Bert.load(folder, threads=1).attention_steps(TEXT, layer=0, head=2, query=3)
    en, zh = steps.formula(), steps.formula("zh")
    assert "softmax(norm(Q)·norm(K)ᵀ · s + mask) · V" in en
    assert ("k, v      = 1 key/value heads, each shared by 3 query heads: head 2 reads "
            "key/value head 0") in en  # fmt: skip
    assert "q/k norm  = q / rms(q) · w_q and k / rms(k) · w_k over d_k, per head" in en
    assert "scaled    = scores · 0.2236 (the model's scale, not 1/√16 = 0.25)" in en
    assert "0 for real tokens with |j - 3| <= 5, -inf outside the window" in en
    assert "只有 1 个键/值头，每个由 3 个查询头共用：头 2 读第 0 个键/值头" in zh
    assert "q 和 k 每个头各自在 d_k 上做 RMS 归一化" in zh
    assert "scores · 0.2236（模型自己的缩放，不是 1/√16 = 0.25）" in zh
    assert "·s" in steps.table() and "win" in steps.table()


def test_a_scale_equal_to_the_articles_keeps_the_articles_line(tmp_path, tiny_checkpoint) -> None:
    """EmbeddingGemma's query_pre_attn_scalar is its head_dim: the scale is the article's
    1/sqrt(d), and the formula says so rather than naming a scale of the model's own."""
    from test_family_gemma3 import TINY, _save

    _save(tmp_path, tokenizer=tiny_checkpoint, **{**TINY, "query_pre_attn_scalar": 16})
    steps = Bert.load(tmp_path, threads=1).attention_steps(TEXT, layer=1, head=0, query=2)
    assert steps.scale is None and steps.window is None  # layer 1 is a full layer
    formula = steps.formula()
    assert "softmax(norm(Q)·norm(K)ᵀ / √d_k + mask) · V" in formula
    assert "scaled    = scores / √16 = scores / 4.000" in formula and "model's scale" not in formula


def test_attend_explains_and_the_page_says_it_has_no_steps_view(tiny, tmp_path, cli) -> None:  # noqa: F811
    folder, _ = tiny
    page = tmp_path / "a.html"
    r = cli("attend", TEXT, "--model", folder, "--html", page)
    assert r.code == 0, r
    assert "no steps view for Gemma 3 models" in r.err and page.is_file()
    r = cli("attend", TEXT, "--model", folder, "--explain", "0:2:head", "--lang", "en")
    assert r.code == 0, r
    assert "1 key/value heads, each shared by 3 query heads" in r.out and "q/k norm" in r.out


def test_onnx_export_is_refused_by_the_familys_name(tiny, tmp_path, cli) -> None:  # noqa: F811
    from bertattn.deploy.onnx_export import export_onnx

    folder, _ = tiny
    message = (r"ONNX export is not available for Gemma 3 models \('gemma3_text'\): bertattn has "
               r"no ONNX export \(bertattn export-onnx\) for Gemma 3's encoder")  # fmt: skip
    with pytest.raises(ValueError, match=message):
        export_onnx(folder, tmp_path / "m.onnx")
    r = cli("export-onnx", "--model", folder, "-o", tmp_path / "m.onnx")
    assert r.code != 0 and "ONNX export is not available for Gemma 3 models" in r.err, r
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_encode_and_serve_run_the_sentence_folder(gemma_st, tmp_path, cli, cli_subprocess) -> None:  # noqa: F811
    """encode (the command line on a corpus file) and serve (a real server on a free loopback
    port, the OpenAI embeddings body) give the Python rows: Dense modules and Normalize in."""
    from serve_server import assert_encode_and_serve_give

    want = Bert.load(gemma_st, threads=1).encode(TEXTS)
    rows, _ = assert_encode_and_serve_give(cli, cli_subprocess, gemma_st, TEXTS, want, tmp_path)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
