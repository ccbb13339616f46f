"""`bertattn encode --restart` keeps the finished chunks whose input bytes are unchanged: a
bad line fixed (with another length) costs only its chunk, the chunks after it are found again at
shifted offsets by their sha256; a changed setting, model or byte (same size) keeps nothing of
what it changes; the failure of a bad line says so. In process, tiny checkpoint, 1 KiB chunks."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest

from bertattn.corpus import InputFile, open_embeddings
from bertattn.distributed import ChunkStore, make_chunks
from bertattn.distributed import runner as runner_mod
from bertattn.distributed.plan import Chunk, chunk_sha256
from bertattn.errors import JobError
from bertattn.jobs import EncodeOptions, run_encode

WORDS = "the attention head looks at every token in the sentence and weighs it".split()
CHUNK = 1024  # --chunk-size 1K
BAD_AT = 2  # the chunk that holds the bad line
GOOD_LINE = "alpha beta gamma delta"
BAD_LINE = b"alpha \xff beta"  # invalid UTF-8: 13 bytes, the fix above has 22


def _lines(n: int = 200, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(2, 9))).encode() for _ in range(n)]


def _data(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def _second_line_of(lines: list[bytes], chunk: int) -> int:
    """The index of the second line of chunk ``chunk`` (as planned for ``lines``)."""
    start = _plan(_data(lines))[chunk][0]
    return _data(lines)[:start].count(b"\n") + 1


def _plan(data: bytes) -> list[tuple[int, int]]:
    """The (start, end) of the chunks planned for ``data`` (``make_chunks``' rule: each ends
    at the first line end at or after ``start + CHUNK``)."""
    starts, pos = [], 0
    while pos < len(data):
        end = len(data) if pos + CHUNK >= len(data) else data.index(b"\n", pos + CHUNK - 1) + 1
        starts.append((pos, end))
        pos = end
    return starts


def _chunk_bytes(data: bytes) -> list[bytes]:
    return [data[s:e] for s, e in _plan(data)]


def _counts(detail: str) -> tuple[int, int]:
    m = re.search(r"(\d+) chunks: (\d+) computed, (\d+) reused", detail)
    assert m, detail
    total, computed, reused = map(int, m.groups())
    assert computed + reused == total, detail
    return computed, reused


@pytest.fixture
def corpus(tmp_path):  # type: ignore[no-untyped-def]
    """(the bad file, its fixed bytes, the index of the bad line): a multi-chunk text file whose
    line in chunk ``BAD_AT`` is invalid UTF-8; the fix is 9 bytes longer."""
    lines = _lines()
    i = _second_line_of(lines, BAD_AT)
    bad = list(lines)
    bad[i] = BAD_LINE
    fixed = list(lines)
    fixed[i] = GOOD_LINE.encode()
    src = tmp_path / "in.txt"
    src.write_bytes(_data(bad))
    planned = make_chunks([InputFile.stat(src)], CHUNK)
    assert [(c.start, c.end) for c in planned] == _plan(_data(bad))  # the helper is the rule
    # the data is as the tests need it: the fix shifts the chunks after the bad one, which keep
    # their bytes; the bad chunk's bytes differ
    old, new = _chunk_bytes(_data(bad)), _chunk_bytes(_data(fixed))
    assert len(old) == len(new) >= 5 and BAD_AT < len(old) - 2
    assert [a == b for a, b in zip(old, new, strict=True)] == [k != BAD_AT for k in range(len(old))]
    assert _plan(_data(bad))[BAD_AT + 1] != _plan(_data(fixed))[BAD_AT + 1]  # shifted
    return src, _data(fixed), i


def _options(src: Path, out: Path | str, model: Path, **kw: object) -> EncodeOptions:
    return EncodeOptions(str(src), str(out), model=str(model), chunk_size="1K", **kw)  # type: ignore[arg-type]


def _fail_last(monkeypatch, index: int) -> None:  # type: ignore[no-untyped-def]
    """Take chunk ``index`` after every other (as when other ranks of ``--workers`` finished
    the later chunks while this one reached the bad line)."""
    original = runner_mod._encode_chunks

    def reordered(store, chunks, *args, **kw):  # type: ignore[no-untyped-def]
        order = [c for c in chunks if c.index != index] + [c for c in chunks if c.index == index]
        return original(store, order, *args, **kw)

    monkeypatch.setattr(runner_mod, "_encode_chunks", reordered)


def _reference(tmp_path: Path, data: bytes, model: Path, **kw: object) -> np.ndarray:
    """A fresh single-process encode of ``data``."""
    src = tmp_path / "ref.txt"
    src.write_bytes(data)
    out = tmp_path / "ref.npy"
    run_encode(EncodeOptions(str(src), str(out), model=str(model), **kw))  # type: ignore[arg-type]
    return np.load(out)


def _kept_logged(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records if "--restart kept" in r.getMessage()]


def _done_before(caplog) -> int:  # type: ignore[no-untyped-def]
    found = [
        int(m.group(1))
        for r in caplog.records
        if (m := re.search(r"in \d+ chunks \((\d+) done before\)", r.getMessage()))
    ]
    assert found, caplog.text
    return found[-1]


# ---------------------------------------------------------------------- the digest
def test_chunk_sha256_is_the_digest_of_the_stored_bytes(tmp_path):
    data = _data(_lines(60))
    (tmp_path / "a.txt").write_bytes(data)
    with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
        f.write(data)
    files = [InputFile.stat(tmp_path / n) for n in ("a.txt", "b.txt.gz")]
    chunks = make_chunks(files, 300)
    assert len(chunks) > 3 and chunks[-1].file == 1
    for c in chunks:
        stored = (tmp_path / ("a.txt", "b.txt.gz")[c.file]).read_bytes()[c.start : c.end]
        want = hashlib.sha256(stored).hexdigest()
        assert chunk_sha256(files[c.file], c) == want
        assert chunk_sha256(files[c.file], c, block=7) == want  # read in blocks
    with pytest.raises(ValueError, match="the file ends at byte"):
        chunk_sha256(files[0], Chunk(0, 0, len(data) - 5, len(data) + 5, "a.txt"))


# ---------------------------------------------------------------------- a bad line, fixed
def test_bad_line_fixed_keeps_every_other_chunk(
    tmp_path, tiny_checkpoint, corpus, monkeypatch, caplog
):
    """Every chunk but the bad one finished (before and after it); the fix changes the line's
    length; --restart computes only the fixed chunk and keeps the others, the later ones at
    shifted offsets. The rows equal a fresh encode of the fixed file."""
    src, fixed, i = corpus
    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    n = len(_plan(fixed))
    _fail_last(monkeypatch, BAD_AT)
    with pytest.raises(JobError) as err:
        run_encode(_options(src, out, tiny_checkpoint, resumable=True))
    message = str(err.value)
    assert f"{src}: line {i + 1}: invalid UTF-8" in message, message
    assert message.endswith(
        f"Fix line {i + 1} of {src}, then rerun with --restart (only the chunks whose input "
        f"lines changed are encoded again): the {n - 1} finished chunks are kept in {parts}."
    ), message
    stats = [json.loads(p.read_text()) for p in sorted(parts.glob("chunk-*.json"))]
    assert len(stats) == n - 1 and all(re.fullmatch(r"[0-9a-f]{64}", s["sha256"]) for s in stats)
    monkeypatch.undo()

    src.write_bytes(fixed)
    caplog.set_level(logging.INFO, logger="bertattn.distributed")
    summary = run_encode(_options(src, out, tiny_checkpoint, restart=True))
    assert _counts(summary.detail) == (1, n - 1), summary  # only the fixed chunk computed
    assert _done_before(caplog) == n - 1
    assert _kept_logged(caplog) == [
        f"--restart kept {n - 1} of {n - 1} finished chunk(s): their input bytes are unchanged"
    ]
    got = np.load(out)
    want = _reference(tmp_path, fixed, tiny_checkpoint)
    assert got.shape == want.shape == (200, 32)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert not parts.exists()


def test_bad_line_fixed_in_order_keeps_the_chunks_before_it(tmp_path, tiny_checkpoint, corpus):
    """One process, in input order: the chunks before the bad one are kept, the rest computed;
    the result equals a fresh chunked run of the fixed file exactly (same chunks)."""
    src, fixed, _ = corpus
    out = tmp_path / "out.npy"
    with pytest.raises(JobError, match=f"the {BAD_AT} finished chunks are kept"):
        run_encode(_options(src, out, tiny_checkpoint, resumable=True))
    src.write_bytes(fixed)
    summary = run_encode(_options(src, out, tiny_checkpoint, restart=True))
    n = len(_plan(fixed))
    assert _counts(summary.detail) == (n - BAD_AT, BAD_AT), summary
    fresh = tmp_path / "fresh.txt"
    fresh.write_bytes(fixed)
    run_encode(_options(fresh, tmp_path / "fresh.npy", tiny_checkpoint, resumable=True))
    np.testing.assert_array_equal(np.load(out), np.load(tmp_path / "fresh.npy"))


# ---------------------------------------------------------------------- nothing kept
@pytest.mark.filterwarnings("ignore:.*were truncated")
@pytest.mark.parametrize("change", ["pooling", "model", "no digests"])
def test_restart_keeps_nothing_of_other_work(
    tmp_path, tiny_checkpoint, tiny_checkpoint_factory, corpus, monkeypatch, caplog, change
):
    """Another setting or model: the old rows are not this run's rows; a store of an older
    bertattn (no sha256 in the counts): nothing was hashed, so nothing is trusted."""
    src, fixed, _ = corpus
    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    _fail_last(monkeypatch, BAD_AT)
    with pytest.raises(JobError):
        run_encode(_options(src, out, tiny_checkpoint, resumable=True))
    monkeypatch.undo()
    n = len(_plan(fixed))
    assert len(list(parts.glob("chunk-*.json"))) == n - 1
    src.write_bytes(fixed)
    model, kw = tiny_checkpoint, {}
    if change == "pooling":
        kw = {"pooling": "cls"}  # the tiny (plain) folder's own is mean
    elif change == "model":
        model = tiny_checkpoint_factory(seed=1)
    else:
        for p in parts.glob("chunk-*.json"):
            stats = json.loads(p.read_text())
            del stats["sha256"]
            p.write_text(json.dumps(stats))
    caplog.set_level(logging.INFO, logger="bertattn.distributed")
    summary = run_encode(_options(src, out, model, restart=True, **kw))
    assert _counts(summary.detail) == (n, 0), summary
    assert _done_before(caplog) == 0
    assert _kept_logged(caplog) == []
    np.testing.assert_allclose(
        np.load(out), _reference(tmp_path, fixed, model, **kw), rtol=0, atol=1e-6
    )


def _finished_shards(tmp_path: Path, model: Path) -> tuple[bytes, Path, Path]:
    """A finished sharded output of :func:`_lines`: the input's bytes, its file, the folder."""
    data = _data(_lines())
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    shards = tmp_path / "shards"
    run_encode(_options(src, f"{shards}/", model))
    return data, src, shards


def test_same_size_change_is_not_kept(tmp_path, tiny_checkpoint, caplog):
    """A finished sharded output; one character replaced in chunk 1 (same size, same offsets
    everywhere): --restart computes that chunk again (its sha256 differs), keeps the others."""
    data, src, shards = _finished_shards(tmp_path, tiny_checkpoint)
    n = len(_plan(data))
    at = _plan(data)[1][0] + 3  # a letter of chunk 1's first line
    assert data[at : at + 1].isalpha()
    changed = data[:at] + (b"Q" if data[at : at + 1] != b"Q" else b"R") + data[at + 1 :]
    assert len(changed) == len(data) and _plan(changed) == _plan(data)
    src.write_bytes(changed)
    caplog.set_level(logging.INFO, logger="bertattn.distributed")
    summary = run_encode(_options(src, f"{shards}/", tiny_checkpoint, restart=True))
    assert _counts(summary.detail) == (1, n - 1), summary
    assert _kept_logged(caplog) == [
        f"--restart kept {n - 1} of {n} finished chunk(s), whose input bytes are unchanged; 1 "
        f"is encoded again: its input bytes changed"
    ]
    index = json.loads((shards / "index.json").read_text())
    assert [s["bytes"] for s in index["shards"]] == [list(r) for r in _plan(changed)]
    assert not list(shards.glob("held-*"))
    got = np.asarray(open_embeddings(shards))
    np.testing.assert_allclose(
        got, _reference(tmp_path, changed, tiny_checkpoint), rtol=0, atol=1e-6
    )
    store = ChunkStore(shards, sharded=True)
    stats = json.loads(store.stats_path(1).read_text())
    assert stats["sha256"] == hashlib.sha256(changed[slice(*_plan(changed)[1])]).hexdigest()


def test_every_chunk_changed_keeps_none_and_says_why(tmp_path, tiny_checkpoint, caplog):
    """One letter replaced in every chunk of a finished sharded output: --restart keeps none,
    and says so (not "kept 0 ...: their input bytes are unchanged")."""
    data, src, shards = _finished_shards(tmp_path, tiny_checkpoint)
    n = len(_plan(data))
    changed = bytearray(data)
    for start, _ in _plan(data):
        changed[start] = ord("Q") if changed[start] != ord("Q") else ord("R")
    assert _plan(bytes(changed)) == _plan(data)
    src.write_bytes(bytes(changed))
    caplog.set_level(logging.INFO, logger="bertattn.distributed")
    summary = run_encode(_options(src, f"{shards}/", tiny_checkpoint, restart=True))
    assert _counts(summary.detail) == (n, 0), summary
    assert _kept_logged(caplog) == [
        f"--restart kept 0 of {n} finished chunk(s): the input bytes of all {n} changed, so "
        f"they are encoded again"
    ]


@pytest.mark.parametrize(
    "kept, finished, said",
    [
        (3, 3, "kept 3 of 3 finished chunk(s): their input bytes are unchanged"),
        (3, 5, "kept 3 of 5 finished chunk(s), whose input bytes are unchanged; 2 are encoded "
               "again: their input bytes changed"),
        (0, 1, "kept 0 of 1 finished chunk(s): its input bytes changed, so it is encoded again"),
    ],
)  # fmt: skip
def test_restart_kept_counts_both_sides(kept, finished, said):
    assert runner_mod.restart_kept(kept, finished) == f"--restart {said}"


# ---------------------------------------------------------------------- the message
def test_bad_line_message_says_the_finished_chunks_are_kept(tmp_path, cli, tiny_checkpoint):
    """What the command line says for a bad line with finished chunks: the line to fix,
    --restart, and that the finished chunks are kept."""
    lines = _lines(80)
    i = _second_line_of(lines, 1)
    lines[i] = BAD_LINE
    (tmp_path / "in.txt").write_bytes(_data(lines))
    got = cli(
        "encode", "in.txt", "-o", "o.npy", "--model", tiny_checkpoint, "--chunk-size", "1K",
        "--resumable", cwd=tmp_path,
    )  # fmt: skip
    assert got.code == 1, got
    line = [x for x in got.err.splitlines() if "error:" in x]
    assert len(line) == 1 and "Traceback" not in got.err, got
    before = _data(lines)[: _data(lines).index(BAD_LINE)]
    finished = sum(1 for _, e in _plan(_data(lines)) if e <= len(before))
    assert finished == 1
    assert line[0].startswith(f"bertattn encode: error: in.txt: line {i + 1}: invalid UTF-8"), line
    assert line[0].endswith(
        f"Fix line {i + 1} of in.txt, then rerun with --restart (only the chunks whose input lines "
        f"changed are encoded again): the {finished} finished chunk"
        f"{'s are' if finished != 1 else ' is'} kept in o.npy.parts."
    ), line
