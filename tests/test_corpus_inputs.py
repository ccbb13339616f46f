"""Many input files (a folder, a glob; plain, .gz, .zst; text and JSON lines) and sharded
outputs through `bertattn encode`, read back with `bertattn.open_embeddings`."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
import zstandard

from bertattn.corpus import open_corpus, open_embeddings
from bertattn.corpus.lines import read_corpus
from bertattn.errors import UsageError

WORDS = "attention weighs every token of the sentence by its query and key".split()


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 14))) for _ in range(n)]


def _corpus(folder, n=(60, 50, 40, 30)) -> list[str]:
    """part-0.txt, part-1.jsonl.gz, part-2.txt.zst, part-3.jsonl and a hidden file; returns
    every text in reading order."""
    folder.mkdir()
    a, b, c, d = (_texts(k, seed) for seed, k in enumerate(n))
    (folder / "part-0.txt").write_text("".join(t + "\n" for t in a))
    with gzip.open(folder / "part-1.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t, "id": f"b{i}"}) + "\n" for i, t in enumerate(b))
    (folder / "part-2.txt.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(t + "\r\n" for t in c).encode())
    )
    (folder / "part-3.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in d))
    (folder / ".hidden.txt").write_text("not read\n")
    return a + b + c + d


def test_folder_glob_and_compressed_files_read_in_order(tmp_path):
    texts = _corpus(tmp_path / "c")
    corpus = open_corpus(tmp_path / "c")
    assert [p.path.name for p in corpus.files] == [
        "part-0.txt",
        "part-1.jsonl.gz",
        "part-2.txt.zst",
        "part-3.jsonl",
    ]
    assert read_corpus(corpus)[0] == texts
    globbed = open_corpus(str(tmp_path / "c" / "part-[12].*"))
    assert read_corpus(globbed)[0] == texts[60:150]
    assert [f.compression for f in corpus.files] == [None, "gzip", "zstd", None]
    with pytest.raises(UsageError, match="matches no file"):
        open_corpus(str(tmp_path / "c" / "nothing-*.txt"))
    with pytest.raises(UsageError, match="is given twice"):
        open_corpus([tmp_path / "c" / "part-0.txt", str(tmp_path / "c" / "part-0*")])


@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_sharded_output_of_many_files_equals_one_process(tmp_path, cli, tiny_checkpoint):
    texts = _corpus(tmp_path / "c")
    (tmp_path / "all.txt").write_text("".join(t + "\n" for t in texts))
    model = ["--model", tiny_checkpoint]
    ref = cli("encode", tmp_path / "all.txt", "-o", tmp_path / "ref.npy", *model)
    assert ref.code == 0, ref
    out = tmp_path / "emb"
    r = cli("encode", tmp_path / "c", "-o", f"{out}/", *model, "--chunk-size", "700")
    assert r.code == 0, r
    assert "4 file(s)" in r.err and f"{out}/ (" in r.err and "shards + index.json" in r.err
    emb = open_embeddings(out)
    want = np.load(tmp_path / "ref.npy")
    assert emb.shape == want.shape == (180, 32)
    np.testing.assert_allclose(np.asarray(emb), want, rtol=0, atol=1e-6)
    # rows map back to files and lines; a compressed file is one shard
    assert emb.locate(0) == (str(tmp_path / "c" / "part-0.txt"), 1)
    assert emb.locate(59) == (str(tmp_path / "c" / "part-0.txt"), 60)
    assert emb.locate(60) == (str(tmp_path / "c" / "part-1.jsonl.gz"), 1)
    assert emb.locate(179) == (str(tmp_path / "c" / "part-3.jsonl"), 30)
    shards = emb.index["shards"]
    assert [s["input"] for s in shards].count(1) == 1 and len(shards) > 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert [f["path"] for f in manifest["inputs"]] == [
        str(f) for f in sorted((tmp_path / "c").glob("part-*"))
    ]
    assert all(f["size"] > 0 and len(f["sample_sha256"]) == 64 for f in manifest["inputs"])
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("chunk-")) == [
        "index.json",
        "manifest.json",
    ]  # no .lock: the run finished

    again = cli("encode", tmp_path / "c", "-o", f"{out}/", *model, "--chunk-size", "700")
    assert again.code == 0 and f"0 computed, {len(shards)} reused" in again.err, again
    with (tmp_path / "c" / "part-3.jsonl").open("a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    changed = cli("encode", tmp_path / "c", "-o", f"{out}/", *model, "--chunk-size", "700")
    assert changed.code == 2, changed  # the folder is finished: it says so, and what changed
    assert f"{out}/ holds the finished output of" in changed.err, changed.err
    assert "part-3.jsonl as it was before it changed (size" in changed.err, changed.err
    assert "--restart" in changed.err
    assert open_embeddings(out).shape == (180, 32)  # a refused run loses nothing
    redo = cli(
        "encode", tmp_path / "c", "-o", f"{out}/", *model, "--chunk-size", "700", "--restart"
    )
    assert redo.code == 0, redo
    assert open_embeddings(out).shape == (181, 32)


def test_ids_go_with_the_rows(tmp_path, cli, tiny_checkpoint):
    src = tmp_path / "docs.jsonl.gz"
    with gzip.open(src, "wt") as f:
        for i, t in enumerate(_texts(25, 7)):
            f.write(json.dumps({"body": t, "key": {"n": i}}) + "\n")
    common = ["--model", tiny_checkpoint, "--field", "body", "--id-field", "key"]
    r = cli("encode", src, "-o", f"{tmp_path / 'sh'}/", *common)
    assert r.code == 0, r
    assert open_embeddings(tmp_path / "sh").ids() == [{"n": i} for i in range(25)]
    r = cli("encode", src, "-o", tmp_path / "o.jsonl", *common, "--resumable")
    assert r.code == 0, r
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(x["index"], x["id"]) for x in rows] == [(i, {"n": i}) for i in range(25)]


def test_error_in_a_later_chunk_names_the_line_of_the_file(tmp_path, cli, tiny_checkpoint):
    lines = [t.encode() for t in _texts(80, 3)]
    lines[56] = b"broken \xff here"
    (tmp_path / "in.txt").write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "sh"
    r = cli(
        "encode",
        tmp_path / "in.txt",
        "-o",
        f"{out}/",
        "--model",
        tiny_checkpoint,
        "--chunk-size",
        "300",
    )
    assert r.code == 1, r
    assert "in.txt: line 57: invalid UTF-8" in r.err, r.err
    assert not (out / "index.json").exists()


@pytest.mark.slow
def test_workers_write_one_sharded_folder(tmp_path, cli_subprocess, tiny_checkpoint):
    texts = _corpus(tmp_path / "c")
    (tmp_path / "all.txt").write_text("".join(t + "\n" for t in texts))
    model = ["--model", tiny_checkpoint]
    assert (
        cli_subprocess("encode", tmp_path / "all.txt", "-o", tmp_path / "ref.npy", *model).code == 0
    )
    out = f"{tmp_path / 'emb'}/"
    r = cli_subprocess(
        "encode",
        tmp_path / "c",
        "-o",
        out,
        *model,
        "--chunk-size",
        "500",
        "--workers",
        "2",
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.code == 0, r
    emb = open_embeddings(tmp_path / "emb")
    np.testing.assert_allclose(emb.to_numpy(), np.load(tmp_path / "ref.npy"), rtol=0, atol=1e-6)
    ranks = {
        json.loads((tmp_path / "emb" / s["stats"]).read_text())["rank"] for s in emb.index["shards"]
    }
    assert ranks == {0, 1}  # both ranks took chunks
