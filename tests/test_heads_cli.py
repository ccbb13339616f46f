"""`bertattn rerank`, `bertattn predict` and `bertattn encode` on a SPLADE model, against the
Python API on the same folders: each parsed JSON line equals the Python answer for its input
(floats within 1e-6); and the bad inputs: one line naming the problem, exit 2 for usage (found
before any work), 1 for a malformed input, and no output file left behind.

The folders: the tiny random model with random heads (a one-label reranker, a three-label
classifier, a BIO tagger: the fixtures of tests/test_heads_cross_encoder.py and
tests/test_heads_pipelines.py) and the real SPLADE model
(``splade_dir``) for fill-mask and sparse encode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_heads_cross_encoder
import test_heads_pipelines

import bertattn

pytestmark = pytest.mark.filterwarnings("ignore:1 of .* were truncated")

DOCS = [
    "the attention head looks at every token",
    "hello world",
    "a query and a key make a score",
    "bert model layer norm",
    " ".join(["token"] * 120),
]
TEXTS = [
    "the attention head looks at every token",
    "hello world, the bert model is ok!",
    "tokenization splits zyxwv into pieces",
]
QUERY = "which head looks at the tokens"

# the folders of the Python API's tests (shared, not built again here)
reranker = test_heads_cross_encoder.reranker
sentiment = test_heads_pipelines.sentiment
tagger = test_heads_pipelines.tagger


def same(ours, theirs) -> None:  # type: ignore[no-untyped-def]
    """Equal nested lists / dictionaries (the same keys, in the same order, the same types);
    floats within 1e-6."""
    test_heads_pipelines.same(ours, theirs, exact=True)


def lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def docs_file(tmp_path) -> Path:
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def texts_file(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------- rerank
@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        ((), {}),
        (("--top-k", "2", "--return-documents"), {"top_k": 2, "return_documents": True}),
        (("--max-tokens-per-doc", "8"), {"max_tokens_per_doc": 8}),
    ],
)
def test_rerank_equals_cross_encoder_rank(cli, reranker, docs_file, tmp_path, flags, kwargs):
    out = tmp_path / "ranked.jsonl"
    r = cli("rerank", QUERY, "-i", docs_file, "--model", reranker, "-o", out, *flags)
    assert r.code == 0, r
    assert r.out == ""
    assert f"bertattn rerank: {out}: 5 documents ranked" in r.err
    want = bertattn.CrossEncoder(reranker).rank(QUERY, DOCS, **kwargs)
    got = lines(out.read_text(encoding="utf-8"))
    same(got, want)
    assert [g["score"] for g in got] == sorted((g["score"] for g in got), reverse=True)


def test_rerank_jsonl_with_ids_to_stdout(cli, reranker, tmp_path):
    src = tmp_path / "docs.jsonl"
    records = [{"body": d, "doc": f"d{i}"} for i, d in enumerate(DOCS)]
    src.write_text("".join(json.dumps(x) + "\n" for x in records), encoding="utf-8")
    r = cli("rerank", QUERY, "-i", src, "--model", reranker, "--field", "body",
            "--id-field", "doc", "--top-k", "3", "-q")  # fmt: skip
    assert r.code == 0, r
    assert r.err == ""
    want = bertattn.CrossEncoder(reranker).rank(QUERY, DOCS, top_k=3)
    got = lines(r.out)
    same([{k: v for k, v in g.items() if k != "id"} for g in got], want)
    assert [g["id"] for g in got] == [f"d{w['corpus_id']}" for w in want]
    assert list(got[0]) == ["corpus_id", "id", "score"]


def test_rerank_reads_stdin(cli, reranker):
    r = cli("rerank", QUERY, "-i", "-", "--model", reranker, "-q", input="\n".join(DOCS[:3]))
    assert r.code == 0, r
    same(lines(r.out), bertattn.CrossEncoder(reranker).rank(QUERY, DOCS[:3]))


# ---------------------------------------------------------------------- predict
@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        ((), {}),
        (("--top-k", "2"), {"top_k": 2}),
        (
            ("--top-k", "3", "--function-to-apply", "none"),
            {"top_k": 3, "function_to_apply": "none"},
        ),
        (("--function-to-apply", "sigmoid"), {"function_to_apply": "sigmoid"}),
    ],
)
def test_predict_text_classification(cli, sentiment, texts_file, tmp_path, flags, kwargs):
    out = tmp_path / "labels.jsonl"
    r = cli("predict", "-i", texts_file, "--model", sentiment, "-o", out, *flags)
    assert r.code == 0, r
    assert "3 inputs (text-classification)" in r.err
    pipe = bertattn.pipeline("text-classification", sentiment)
    got = lines(out.read_text(encoding="utf-8"))
    same(got, pipe(TEXTS, **kwargs))
    for text, line in zip(TEXTS, got, strict=True):  # each line is the answer for its input
        answer = pipe(text, **kwargs)
        same(line, answer[0] if not kwargs.get("top_k") else answer)


def test_predict_text_pairs_from_jsonl(cli, sentiment, tmp_path):
    items = [
        {"text": TEXTS[0], "text_pair": TEXTS[1]},
        {"text": TEXTS[2]},
        {"text": TEXTS[1], "text_pair": None},
        {"text": TEXTS[2], "text_pair": TEXTS[0]},
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in items) + "\n", encoding="utf-8")
    pipe = bertattn.pipeline("text-classification", sentiment)
    want = pipe([x if x.get("text_pair") else {"text": x["text"]} for x in items], top_k=None)
    r = cli("predict", "-i", src, "--model", sentiment, "--top-k", "3", "-q")
    assert r.code == 0, r
    same(lines(r.out), want)
    # stdin too (read once: copied, then read like the file)
    r = cli("predict", "-i", "-", "--field", "text", "--model", sentiment, "--top-k", "3",
            "-q", input=src.read_text(encoding="utf-8"))  # fmt: skip
    assert r.code == 0, r
    same(lines(r.out), want)
    single = pipe({"text": TEXTS[0], "text_pair": TEXTS[1]}, top_k=3)
    same(lines(r.out)[0], single)
    # a folder of a plain text file and a JSON-lines file: read file by file, in name order
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXTS[0] + "\n", encoding="utf-8")
    (folder / "b.jsonl").write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    r = cli("predict", "-i", folder, "--model", sentiment, "--top-k", "3", "-q")
    assert r.code == 0, r
    same(lines(r.out), [pipe(TEXTS[0], top_k=3), *want])


@pytest.mark.parametrize("strategy", [None, "simple", "first", "average", "max"])
def test_predict_token_classification(cli, tagger, texts_file, strategy):
    flags = () if strategy is None else ("--aggregation-strategy", strategy)
    r = cli("predict", "-i", texts_file, "--model", tagger, "-q", *flags)
    assert r.code == 0, r
    pipe = bertattn.pipeline("token-classification", tagger)
    want = pipe(TEXTS, aggregation_strategy=strategy or "none")
    got = lines(r.out)
    same(got, want)
    assert sum(len(x) for x in got) > 3  # entities were found
    same(got[1], pipe(TEXTS[1], aggregation_strategy=strategy or "none"))


def test_predict_fill_mask(cli, splade_dir, tmp_path):
    texts = ["the cat sat on the [MASK].", "paris is the [MASK] of [MASK]."]
    src = tmp_path / "masked.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    pipe = bertattn.pipeline("fill-mask", splade_dir)
    r = cli("predict", "-i", src, "--model", splade_dir, "--top-k", "3", "-q")
    assert r.code == 0, r
    got = lines(r.out)
    same(got, pipe(texts, top_k=3))
    same(got[0], pipe(texts[0], top_k=3))  # one mask: a list of proposals
    assert len(got[1]) == 2 and len(got[1][0]) == 3  # two masks: a list per mask
    one = tmp_path / "one.txt"  # one input line: still one answer, not unwrapped
    one.write_text(texts[0] + "\n", encoding="utf-8")
    r = cli("predict", "-i", one, "--model", splade_dir, "-q")
    assert r.code == 0, r
    same(lines(r.out), [pipe(texts[0])])


# ---------------------------------------------------------------------- encode (SPLADE)
def test_encode_splade_writes_sparse_rows(cli, splade_dir, tmp_path, monkeypatch):
    import bertattn.jobs.heads

    monkeypatch.setattr(bertattn.jobs.heads, "SPARSE_BLOCK", 2)  # two blocks: 2 texts, then 1
    texts = ["the cat sat on the mat", "hello world", ""]
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t, "key": i * 10}) + "\n" for i, t in enumerate(texts)),
        encoding="utf-8",
    )
    out = tmp_path / "sparse.jsonl"
    r = cli("encode", src, "-o", out, "--model", splade_dir, "--id-field", "key", "--sparse")
    assert r.code == 0, r
    assert "SPLADE sparse rows of 30522" in r.err
    model = bertattn.SparseEncoder(splade_dir)  # the same blocks (their padding: ~1e-6 apart)
    rows = [*model.encode(texts[:2]).to_dense(), *model.encode(texts[2:]).to_dense()]
    got = lines(out.read_text(encoding="utf-8"))
    assert [list(g) for g in got] == [["index", "id", "indices", "values"]] * 3
    for i, (g, row) in enumerate(zip(got, rows, strict=True)):
        assert g["index"] == i and g["id"] == i * 10
        want = row.nonzero().flatten().tolist()
        assert g["indices"] == want and want == sorted(want) and len(want) > 0
        assert g["values"] == pytest.approx(row[want].tolist(), abs=1e-6)


def test_encode_sentence_transformers_splade_folder_to_stdout(cli, splade_dir, tmp_path):
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    st = STSparseEncoder(str(splade_dir), device="cpu")
    st[1] = SpladePooling(pooling_strategy="sum", activation_function="log1p_relu")
    st.save(str(tmp_path / "st"))
    texts = ["the cat sat on the mat", "attention is all you need"]
    r = cli("encode", "-", "-o", "-", "--model", tmp_path / "st", "-q", input="\n".join(texts))
    assert r.code == 0, r
    assert r.err == ""
    rows = bertattn.SparseEncoder(tmp_path / "st").encode(texts).to_dense()
    for i, (g, row) in enumerate(zip(lines(r.out), rows, strict=True)):
        want = row.nonzero().flatten().tolist()
        assert list(g) == ["index", "indices", "values"] and g["index"] == i
        assert g["indices"] == want
        assert g["values"] == pytest.approx(row[want].tolist(), abs=1e-6)


def test_which_folders_encode_as_sparse(splade_dir, tiny_checkpoint, minilm_dir, tmp_path):
    from bertattn.jobs.heads import can_be_sparse, is_sparse_model

    # a plain BertForMaskedLM folder may be SPLADE or a plain BERT (bert-base-uncased is one):
    # dense unless --sparse; a sentence-transformers SPLADE folder says so itself
    assert not is_sparse_model(str(splade_dir)) and can_be_sparse(str(splade_dir))
    from sentence_transformers import SparseEncoder as STSparseEncoder

    STSparseEncoder(str(splade_dir), device="cpu").save(str(tmp_path / "st"))
    assert is_sparse_model(str(tmp_path / "st"))
    assert not is_sparse_model(str(tiny_checkpoint))  # BertModel
    assert not can_be_sparse(str(tiny_checkpoint))
    assert not is_sparse_model(str(minilm_dir))  # modules.json with Pooling: dense
    assert not is_sparse_model(None)  # the default model
    assert not is_sparse_model(str(tmp_path / "missing"))  # left to the dense path's message


def test_encode_splade_npy_refused_and_no_sparse_is_dense(
    cli, splade_dir, tiny_checkpoint, tmp_path
):
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\nhello\n", encoding="utf-8")
    out = tmp_path / "rows.npy"
    r = cli("encode", src, "-o", out, "--model", splade_dir, "--sparse")
    assert r.code == 2, r
    assert r.err.count("\n") == 1 and "bertattn encode: error:" in r.err
    assert "SPLADE (sparse) model" in r.err and ".jsonl" in r.err
    assert not out.exists()
    jsonl = tmp_path / "rows.jsonl"
    r = cli("encode", src, "-o", jsonl, "--model", splade_dir, "--pooling", "mean", "--sparse")
    _error(r, 2, "--pooling applies to dense embeddings only")
    assert not jsonl.exists()
    r = cli("encode", src, "-o", jsonl, "--model", tiny_checkpoint, "--sparse")
    _error(r, 2, "--sparse needs a SPLADE model")
    assert not jsonl.exists()
    with pytest.warns(UserWarning):  # the dense path as before: the head's tensors skipped
        bert = bertattn.Bert.load(splade_dir)
    r = cli("encode", src, "-o", out, "--model", splade_dir, "-q")  # dense, as before
    assert r.code == 0, r
    import numpy as np

    np.testing.assert_allclose(np.load(out), bert.encode(["the cat sat", "hello"]), atol=1e-6)


# ---------------------------------------------------------------------- bad input
def _error(r, code: int, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert r.code == code, r
    assert r.err.count("\n") == 1 and r.err.startswith("bertattn "), r
    assert " error: " in r.err and "Traceback" not in r.err, r
    for needle in needles:
        assert needle in r.err, (needle, r.err)


def test_rerank_refuses_a_model_that_is_not_a_reranker(cli, sentiment, tagger, docs_file, tmp_path):
    out = tmp_path / "out.jsonl"
    r = cli("rerank", QUERY, "-i", docs_file, "--model", sentiment, "-o", out)
    _error(r, 2, "rerank: error:", "one-label", "3 labels (negative, neutral, positive)",
           "bertattn predict")  # fmt: skip
    r = cli("rerank", QUERY, "-i", docs_file, "--model", tagger, "-o", out)
    _error(r, 2, "BertForTokenClassification")
    # found before the input is read: a missing input is not what it says
    r = cli("rerank", QUERY, "-i", tmp_path / "nope.txt", "--model", tagger, "-o", out)
    _error(r, 2, "BertForTokenClassification")
    assert not out.exists()


def test_predict_refuses_options_the_head_does_not_take(  # noqa: PLR0913
    cli, sentiment, tagger, splade_dir, tiny_checkpoint, texts_file, tmp_path
):
    out = tmp_path / "out.jsonl"
    r = cli("predict", "-i", texts_file, "--model", sentiment, "--aggregation-strategy",
            "simple", "-o", out)  # fmt: skip
    _error(r, 2, "--aggregation-strategy does not apply", "text-classification")
    r = cli("predict", "-i", texts_file, "--model", tagger, "--top-k", "2", "-o", out)
    _error(r, 2, "--top-k does not apply", "token-classification", "--aggregation-strategy")
    r = cli("predict", "-i", texts_file, "--model", splade_dir, "--function-to-apply", "none")
    _error(r, 2, "--function-to-apply does not apply", "fill-mask")
    r = cli("predict", "-i", texts_file, "--model", tiny_checkpoint, "-o", out)
    _error(r, 2, "predict needs a BertForSequenceClassification", "bertattn encode")
    assert not out.exists()


@pytest.mark.parametrize("command", ["rerank", "predict"])
def test_bad_usage_exits_2_before_any_work(cli, command, reranker, sentiment, docs_file,
                                           tmp_path):  # fmt: skip
    model = reranker if command == "rerank" else sentiment
    head = ("rerank", QUERY) if command == "rerank" else ("predict",)
    out = tmp_path / "out.jsonl"
    r = cli(*head, "-i", docs_file, "--model", model, "--top-k", "0", "-o", out)
    _error(r, 2, "--top-k must be an integer >= 1, got 0")
    r = cli(*head, "-i", tmp_path / "missing.txt", "--model", model, "-o", out)
    _error(r, 2, "missing.txt does not exist")
    r = cli(*head, "-i", docs_file, "--model", model, "-o", tmp_path / "out.npy")
    _error(r, 2, "writes JSON lines", ".jsonl")
    r = cli(*head, "-i", docs_file, "--model", model, "-o", docs_file)
    _error(r, 2, "--output")
    r = cli(*head, "-i", docs_file, "--model", model, "--max-length", "9999", "-o", out)
    _error(r, 2, "--max-length 9999 exceeds what the model takes")
    if command == "rerank":
        r = cli("rerank", " ", "-i", docs_file, "--model", model, "-o", out)
        _error(r, 2, "QUERY is empty")
    r = cli(*head, "-i", docs_file, "-o", out)  # no --model: argparse's usage error
    assert r.code == 2 and "--model" in r.err, r
    assert not out.exists()


@pytest.mark.parametrize("command", ["rerank", "predict"])
def test_empty_input_exits_1_and_writes_nothing(cli, command, reranker, sentiment, tmp_path):
    src = tmp_path / "empty.txt"
    src.write_text("", encoding="utf-8")
    model = reranker if command == "rerank" else sentiment
    head = ("rerank", QUERY) if command == "rerank" else ("predict",)
    out = tmp_path / "out.jsonl"
    r = cli(*head, "-i", src, "--model", model, "-o", out)
    _error(r, 1, "empty.txt holds no", "nothing is written")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]  # no temporary file left either


def test_malformed_pairs_exit_1_naming_the_line(cli, sentiment, tagger, tmp_path):
    out = tmp_path / "out.jsonl"
    src = tmp_path / "pairs.jsonl"
    src.write_text(
        json.dumps({"text": "a", "text_pair": "b"}) + "\n"
        + json.dumps({"text": "c", "text_pair": ["d", "e"]}) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    r = cli("predict", "-i", src, "--model", sentiment, "-o", out)
    _error(r, 1, "pairs.jsonl: line 2", "'text_pair' is an array", "not a string")
    r = cli("predict", "-i", src, "--model", tagger, "-o", out)
    _error(r, 1, "pairs.jsonl: line 1", "takes single texts")
    r = cli("predict", "-i", "-", "--field", "text", "--model", sentiment, "-o", out,
            input=src.read_text(encoding="utf-8"))  # fmt: skip
    _error(r, 1, "<stdin>: line 2", "'text_pair' is an array")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"txt": "b"}\n', encoding="utf-8")
    r = cli("predict", "-i", bad, "--model", sentiment, "-o", out)
    _error(r, 1, "bad.jsonl: line 2", "no field 'text'")
    r = cli("rerank", QUERY, "-i", bad, "--model", sentiment.parent, "-o", out)
    assert r.code in (1, 2) and r.err.count("\n") == 1, r  # not a model folder: one line
    assert not out.exists()


def test_fill_mask_without_mask_exits_1(cli, splade_dir, texts_file, tmp_path):
    out = tmp_path / "out.jsonl"
    r = cli("predict", "-i", texts_file, "--model", splade_dir, "-o", out)
    _error(r, 1, "input 0 has no [MASK]")
    assert not out.exists()


@pytest.mark.slow
def test_rerank_and_predict_as_processes(cli_subprocess, reranker, sentiment, docs_file):
    r = cli_subprocess("rerank", QUERY, "-i", docs_file, "--model", reranker, "--top-k", "2")
    assert r.code == 0, r
    same(lines(r.out), bertattn.CrossEncoder(reranker).rank(QUERY, DOCS, top_k=2))
    r = cli_subprocess("predict", "-i", "-", "--model", sentiment, input="\n".join(TEXTS))
    assert r.code == 0, r
    same(lines(r.out), bertattn.pipeline("text-classification", sentiment)(TEXTS))
    r = cli_subprocess("predict", "-i", docs_file, "--model", sentiment, "--top-k", "0")
    assert r.code == 2 and r.err.count("\n") == 1, r


@pytest.mark.filterwarnings("ignore:5 of 5 inputs were longer")
def test_rerank_max_length_cuts_pairs_as_the_python_api(cli, reranker, docs_file):
    r = cli("rerank", QUERY, "-i", docs_file, "--model", reranker, "--max-length", "12", "-q")
    assert r.code == 0, r
    want = bertattn.CrossEncoder(reranker, max_length=12).rank(QUERY, DOCS)
    same(lines(r.out), want)
    assert want != bertattn.CrossEncoder(reranker).rank(QUERY, DOCS)  # the cut mattered
