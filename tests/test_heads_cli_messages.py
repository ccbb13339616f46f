"""What a hostile user found in ``bertattn rerank`` / ``predict`` / sparse ``encode``: a bad text
read from a file is named by its file and line (not ``pairs[0]``), and these errors, like the
usage errors, are found before the model loads (the model's loading is replaced by a failure
here: had it run, the test would see that failure instead). Exit 1 for a malformed input, 2 for
usage; one line; no output file."""

from __future__ import annotations

import pytest
import test_heads_cross_encoder
import test_heads_pipelines

import bertattn.heads

reranker = test_heads_cross_encoder.reranker
sentiment = test_heads_pipelines.sentiment


@pytest.fixture
def no_loading(monkeypatch):  # type: ignore[no-untyped-def]
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the model was loaded before the input was checked")

    for name in ("CrossEncoder", "SparseEncoder", "pipeline"):
        monkeypatch.setattr(bertattn.heads, name, refuse)


def _one_line(err: str, start: str) -> str:
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith(start), err
    return lines[0]


def test_rerank_names_the_file_and_line_of_a_bad_document(cli, reranker, tmp_path, no_loading):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "fine"}\n\n{"text": "a \\ud800 b"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    r = cli("rerank", "a query", "-i", docs, "--model", reranker, "-o", out)
    assert r.code == 1, r
    line = _one_line(r.err, "bertattn rerank: error: ")
    assert f"{docs}: line 3: field 'text' holds a lone surrogate (U+D800) at character 2" in line
    assert "pairs[" not in line and not out.exists()


def test_predict_names_the_file_and_line_of_a_bad_text_pair(cli, sentiment, tmp_path, no_loading):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok"}\n{"text": "ok", "text_pair": "x \\udc00"}\n', encoding="utf-8")
    r = cli("predict", "-i", src, "--model", sentiment)
    assert r.code == 1, r
    line = _one_line(r.err, "bertattn predict: error: ")
    assert f"{src}: line 2: field 'text_pair' holds a lone surrogate (U+DC00)" in line


def test_a_bad_query_is_a_usage_error_before_loading(cli, reranker, tmp_path, no_loading):
    docs = tmp_path / "docs.txt"
    docs.write_text("fine\n", encoding="utf-8")
    r = cli("rerank", "q \udc80", "-i", docs, "--model", reranker)
    assert r.code == 2, r
    assert "QUERY holds a lone surrogate (U+DC80) at character 2" in _one_line(r.err, "bertattn")


@pytest.mark.parametrize("sparse", ["--sparse", "--no-sparse"])
def test_encode_max_length_is_checked_before_loading(
    cli, splade_dir, tmp_path, no_loading, monkeypatch, sparse
):
    import bertattn.encoder

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the model was loaded before --max-length was checked")

    monkeypatch.setattr(bertattn.encoder.Bert, "load", refuse)
    texts = tmp_path / "t.txt"
    texts.write_text("a text\n", encoding="utf-8")
    out = tmp_path / "o.jsonl"
    r = cli("encode", texts, "-o", out, "--model", splade_dir, "--max-length", "100000", sparse)
    assert r.code == 2, r
    line = _one_line(r.err, "bertattn encode: error: ")
    assert "--max-length 100000 exceeds what the model takes (max_position_embeddings 512)" in line
    assert not out.exists()
