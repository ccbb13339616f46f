"""``bertattn encode --late-chunks``: one row per span of each JSON line, equal to
``Bert.encode_late_chunks`` (itself held to transformers in test_late_chunks.py), each row's
source (record, span, id) recorded in .jsonl; options and spans refused before the model
loads, with messages that name the record and the fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import bertattn

DOC = "Berlin is the capital of Germany. It has about 3.7 million people. It has museums."
LONG = " ".join(f"word{i % 17} is here." for i in range(120))  # > 128 tokens (tiny model)
RECORDS = [
    {"text": DOC, "spans": [[0, 33], [34, 66], [67, len(DOC)]], "id": "berlin"},
    {"text": "Paris is the capital of France.", "spans": [[0, 31]], "id": 7},
    {"text": LONG, "spans": [[0, 300], [300, len(LONG)]], "id": None},
]


@pytest.fixture
def source(tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS), encoding="utf-8")
    return path


def _want(model) -> np.ndarray:  # type: ignore[no-untyped-def]
    bert = bertattn.Bert.load(model, threads=1)
    return np.concatenate(
        [bert.encode_late_chunks(r["text"], r["spans"], pooling="mean") for r in RECORDS]
    )


def test_jsonl_rows_and_sources(cli, source, tmp_path, tiny_checkpoint):
    want = _want(tiny_checkpoint)
    out = tmp_path / "rows.jsonl"
    r = cli(
        "encode", source, "-o", out, "--late-chunks", "--model", tiny_checkpoint,
        "--pooling", "mean", "--id-field", "id",
    )  # fmt: skip
    assert r.code == 0, r.err
    assert "3 texts, 6 spans" in r.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["index"], x["record"], x["span"], x["id"]) for x in rows] == [
        (0, 0, [0, 33], "berlin"),
        (1, 0, [34, 66], "berlin"),
        (2, 0, [67, len(DOC)], "berlin"),
        (3, 1, [0, 31], 7),
        (4, 2, [0, 300], None),
        (5, 2, [300, len(LONG)], None),
    ]
    np.testing.assert_allclose(np.array([x["embedding"] for x in rows]), want, atol=1e-6)
    npy = tmp_path / "rows.npy"
    r = cli(
        "encode", source, "-o", npy, "--late-chunks", "--model", tiny_checkpoint,
        "--pooling", "mean",
    )  # fmt: skip
    assert r.code == 0, r.err
    np.testing.assert_allclose(np.load(npy), want, atol=1e-6)


@pytest.mark.parametrize(
    ("records", "extra", "words"),
    [
        ([{"text": "abc", "spans": [[0, 9]]}], (), ["record 0", "spans[0] = (0, 9)", "<= 3"]),
        ([{"text": "abc", "spans": [[2, 3], [0, 1]]}], (), ["record 0", "in order"]),
        ([{"text": "abc", "spans": "0-3"}], (), ["record 0", "spans must be a list"]),
        ([{"text": "abc"}], (), ['no "spans" field', '"spans": [[0, 120]']),
        ([{"text": "abc", "spans": [[0, 3]]}], ("--workers", "2"), ["cannot go with --workers"]),
        ([{"text": "abc", "spans": [[0, 3]]}], ("--sparse",), ["cannot go with --sparse"]),
        ([{"text": "abc", "spans": [[0, 3]]}], ("--id-field", "spans"), ["--id-field spans"]),
    ],
)
def test_refused_before_the_model_loads(cli, tmp_path, tiny_checkpoint, records, extra, words):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    model = tmp_path / "model"  # no weights: a run that got as far as loading would fail so
    model.mkdir()
    for f in tiny_checkpoint.iterdir():
        if f.name != "model.safetensors":
            (model / f.name).write_bytes(f.read_bytes())
    r = cli(
        "encode", path, "-o", tmp_path / "o.jsonl", "--late-chunks", "--model", model,
        "--pooling", "mean", *extra,
    )  # fmt: skip
    assert r.code != 0
    for w in words:
        assert w in r.err, r.err
    assert not (tmp_path / "o.jsonl").exists()


def test_cls_pooling_is_refused(cli, source, tmp_path, tiny_checkpoint):
    r = cli("encode", source, "-o", tmp_path / "o.npy", "--late-chunks", "--model", tiny_checkpoint,
            "--pooling", "cls")  # fmt: skip
    assert r.code == 2
    assert "--pooling cls" in r.err and "add --pooling mean" in r.err, r
    cls_folder = tmp_path / "st-cls"  # a sentence-transformers folder whose Pooling is CLS
    shutil.copytree(tiny_checkpoint, cls_folder)
    (cls_folder / "1_Pooling").mkdir()
    (cls_folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (cls_folder / "modules.json").write_text(json.dumps([
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))  # fmt: skip
    r = cli("encode", source, "-o", tmp_path / "o.npy", "--late-chunks", "--model", cls_folder)
    assert r.code == 2
    assert "the model folder pools [CLS]" in r.err and "--pooling mean" in r.err, r
