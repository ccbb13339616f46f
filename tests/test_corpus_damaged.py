"""Damaged inputs at the data edges: a compressed input cut short is refused (never encoded
short with exit 0), in a plain run, a sharded run and a ``--workers`` run; a damaged shard is
named and the rerun its message advises mends it; a JSON line nested 100,000 deep is one error
naming the file and the line."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import zstandard

from bertattn.corpus import open_corpus, open_embeddings
from bertattn.corpus.lines import read_corpus


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"text number %d\n" % i for i in range(first, last))


def _two_frames() -> tuple[bytes, int]:
    """A .zst of 100 lines in two frames (50 lines each); returns it and the first's size."""
    c = zstandard.ZstdCompressor()
    a, b = c.compress(_lines(0, 50)), c.compress(_lines(50, 100))
    return a + b, len(a)


def _cut_files(tmp_path):
    """one.txt.zst cut in its only frame, two.txt.zst cut in its second frame, whole.txt.zst"""
    data, first = _two_frames()
    one = zstandard.ZstdCompressor().compress(_lines(0, 100))
    (tmp_path / "one.txt.zst").write_bytes(one[: len(one) // 2])
    (tmp_path / "two.txt.zst").write_bytes(data[: first + (len(data) - first) // 2])
    (tmp_path / "whole.txt.zst").write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("name", ["one.txt.zst", "two.txt.zst"])
def test_truncated_zst_is_refused_naming_the_file(tmp_path, name):
    _cut_files(tmp_path)
    texts, _ = read_corpus(open_corpus(tmp_path / "whole.txt.zst"))  # every frame is read
    assert texts == [f"text number {i}" for i in range(100)]
    with pytest.raises(ValueError, match=rf"{name}: cannot decompress .*truncated.*zstd -t"):
        read_corpus(open_corpus(tmp_path / name))


def test_truncated_gz_is_still_refused(tmp_path):
    data = gzip.compress(_lines(0, 100))
    (tmp_path / "cut.txt.gz").write_bytes(data[:-20])
    with pytest.raises(ValueError, match=r"cut.txt.gz: cannot decompress .*gzip -t"):
        read_corpus(open_corpus(tmp_path / "cut.txt.gz"))


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("name", ["one.txt.zst", "two.txt.zst"])
def test_cli_refuses_a_truncated_zst(tmp_path, cli, tiny_checkpoint, name, sharded):
    _cut_files(tmp_path)
    out = f"{tmp_path / 'sh'}/" if sharded else tmp_path / "o.npy"
    r = cli("encode", tmp_path / name, "-o", out, "--model", tiny_checkpoint)
    assert r.code == 1, r
    assert "Traceback" not in r.err and f"{name}: cannot decompress" in r.err, r.err
    assert "truncated" in r.err, r.err
    assert not (tmp_path / "o.npy").exists() and not (tmp_path / "sh" / "index.json").exists()


@pytest.mark.slow
def test_workers_refuse_a_truncated_zst(tmp_path, cli_subprocess, tiny_checkpoint):
    _cut_files(tmp_path)
    r = cli_subprocess(
        "encode",
        tmp_path / "two.txt.zst",
        "-o",
        f"{tmp_path / 'sh'}/",
        "--model",
        tiny_checkpoint,
        "--workers",
        "2",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.code == 1, r
    assert "two.txt.zst: cannot decompress" in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "sh" / "index.json").exists()


def test_a_damaged_shard_is_named_and_the_rerun_it_advises_mends_it(tmp_path, cli, tiny_checkpoint):
    (tmp_path / "in.txt").write_bytes(_lines(0, 60))
    argv = ["encode", tmp_path / "in.txt", "-o", f"{tmp_path / 'sh'}/", "--model", tiny_checkpoint]
    assert cli(*argv, "--chunk-size", "300").code == 0
    want = open_embeddings(tmp_path / "sh").to_numpy()
    shard = tmp_path / "sh" / "chunk-00001.npy"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"chunk-00001.npy is cut short.* rerun the encode"):
        open_embeddings(tmp_path / "sh")
    r = cli(*argv, "--chunk-size", "300")
    assert r.code == 0, r
    np.testing.assert_array_equal(open_embeddings(tmp_path / "sh").to_numpy(), want)


DEEP = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("sharded", [False, True])
def test_deeply_nested_json_line_is_named(tmp_path, cli, tiny_checkpoint, sharded):
    (tmp_path / "in.jsonl").write_text('{"text": "fine"}\n' + DEEP + "\n")
    out = f"{tmp_path / 'sh'}/" if sharded else tmp_path / "o.npy"
    r = cli(
        "encode", tmp_path / "in.jsonl", "-o", out, "--field", "text", "--model", tiny_checkpoint
    )
    assert r.code == 1, r
    assert "Traceback" not in r.err and "RecursionError" not in r.err, r.err
    assert "in.jsonl: line 2: JSON nested too deeply to read" in r.err, r.err
    if sharded:  # the fix is the line, not a rerun (which failed the same way)
        assert "Fix line 2 of" in r.err and "Rerun the same command" not in r.err, r.err


def test_deeply_nested_json_first_line_of_plain_text_is_read_as_text(tmp_path):
    (tmp_path / "in.txt").write_text(DEEP + "\n")
    texts, _ = read_corpus(open_corpus(tmp_path / "in.txt"))
    assert texts == [DEEP]
