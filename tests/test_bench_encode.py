"""`bertattn bench --encode`: texts per second of a model's encode in each dtype this CPU
offers (float32 always; bfloat16 where native; int8 where the model takes it), what `--dtype
auto` picks here and why, and progress on stderr as it runs; and `bertattn bench` saying what
it does instead of printing a raw dict and going quiet. Tiny counts: a few texts, one round."""

from __future__ import annotations

import json
import re

import pytest

from bertattn.bench.encode import EncodeResult, bench_texts, format_encode_table
from bertattn.runtime.cpu import cpu_capability


def test_the_texts_are_distinct_and_counted():
    texts = bench_texts(13)
    assert len(texts) == 13 and len(set(texts)) == 13
    with pytest.raises(ValueError, match="at least one text, got 0"):
        bench_texts(0)


def test_the_table_gives_rates_ms_and_the_ratio_to_float32():
    rows = [
        EncodeResult("float32", 10, [1.0], 10.0),
        EncodeResult("bfloat16", 10, [0.5], 20.0),
        EncodeResult("int8", 10, [], None, "refused here: no VNNI"),
    ]
    lines = format_encode_table(rows).splitlines()
    assert lines[0].split() == ["dtype", "texts/s", "ms/text", "vs", "fp32"]
    assert lines[1].split() == ["float32", "10.0", "100.00", "1.00x"]
    assert lines[2].split() == ["bfloat16", "20.0", "50.00", "2.00x"]
    assert lines[3].split(None, 1) == ["int8", "refused here: no VNNI"]


def test_bench_encode_times_each_offered_dtype(cli, tiny_checkpoint):
    r = cli("bench", "--encode", "--model", tiny_checkpoint, "--texts", "4", "--repeats", "1")
    assert r.code == 0, r
    rows = {line.split()[0]: line for line in r.out.splitlines() if line[:1].islower()}
    assert re.match(r"float32\s+\d+\.\d\s+\d+\.\d\d\s+1\.00x$", rows["float32"]), r.out
    if cpu_capability()["bf16_matmul"] == "native":
        assert re.match(r"bfloat16\s+\d+\.\d", rows["bfloat16"]), r.out
    else:
        assert "not timed: bf16 is emulated on this CPU" in rows["bfloat16"], r.out
    assert re.match(r"int8\s+(\d+\.\d|refused here: )", rows["int8"]), r.out
    assert re.search(r"^--dtype auto picks (float32|bfloat16) here: \S", r.out, re.M), r.out
    assert "{'" not in r.out  # no raw dict
    # progress on stderr, as it runs
    assert "bertattn bench: float32: loading the model" in r.err
    assert "bertattn bench: float32: round 1/1, " in r.err and "texts/s" in r.err


def test_bench_encode_json(cli, tiny_checkpoint):
    r = cli("bench", "--encode", "--model", tiny_checkpoint, "--texts", "3", "--repeats", "2",
            "--json", "-")  # fmt: skip
    assert r.code == 0, r
    data = json.loads(r.out)
    first = data["encode"][0]
    assert first["dtype"] == "float32" and first["texts"] == 3 and len(first["seconds"]) == 2
    assert first["texts_per_s"] > 0
    assert [row["dtype"] for row in data["encode"]] == ["float32", "bfloat16", "int8"]
    assert data["auto"]["dtype"] in ("float32", "bfloat16") and data["auto"]["why"]
    assert "dtype" in r.err  # the table on stderr with --json -


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--encode", "--dispatch"), "--encode and --dispatch are two benchmarks"),
        (("--encode", "--texts", "0"), "--texts must be an integer >= 1, got 0."),
        (("--model", "x"), "--model goes with --encode"),
    ],
)
def test_bench_encode_usage_errors(cli, argv, said):
    r = cli("bench", *argv)
    assert r.code == 2 and said in r.err and r.out == "", r


def test_the_module_benchmark_says_what_it_does(cli, monkeypatch):
    import bertattn.bench.module as module

    told: list[str] = []

    def fake(cases=None, *, repeats=5, progress=None):
        progress("case 1/1: B=8 L=128 float32")
        told.append("ran")
        return []

    monkeypatch.setattr(module, "run_module_bench", fake)
    r = cli("bench", "--cases", "1", "--repeats", "1")
    assert r.code == 0 and told == ["ran"], r
    assert "{'" not in r.out and r.out.splitlines()[1].startswith("on: "), r.out
    assert "bertattn bench: timing 1 case x 1 rounds" in r.err
    assert "bertattn bench: case 1/1: B=8 L=128 float32" in r.err
