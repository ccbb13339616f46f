"""What a chunked `bertattn encode` (``--resumable``, ``--workers``, ``-o OUT/``) says when it
fails: one line, no exception class name, the real fix (the input line to correct, the disk to
free, ``--restart``), the finished chunks kept and said so only when there are some; a plain run
refused while a chunked run writes the same output; a finished sharded folder named as such."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

from bertattn.distributed import ChunkStore
from bertattn.files import FolderLock

ENV = {"OMP_NUM_THREADS": "1"}
GOOD = '{"text": "alpha beta gamma"}'  # 29 bytes: with --chunk-size 16, one line a chunk
BAD = '{"text": "alpha beta'  # line 3 below: not valid JSON


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _error_line(err: str) -> str:
    """The one error line (there must be exactly one), with no traceback nor class name."""
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    for name in ("ValueError:", "OSError:", "RuntimeError:", "[Errno", ".;"):
        assert name not in err, err
    return lines[0]


def _chunked(cli, tmp_path, model, *args, env=None):  # type: ignore[no-untyped-def]
    return cli("encode", *args, "--model", model, "--chunk-size", "16", env=env, cwd=tmp_path)


def _failed_line(cli, tmp_path, model, name: str, records: list) -> str:  # type: ignore[no-untyped-def]
    """Write ``records`` as ``name``, encode it resumably to r.npy: it fails (exit 1) with one
    error line, which is returned."""
    _jsonl(tmp_path / name, records)
    got = _chunked(cli, tmp_path, model, name, "-o", "r.npy", "--resumable")
    assert got.code == 1, got
    return _error_line(got.err)


# ---------------------------------------------------------------------- 1. input errors
FIX_3 = (
    "Fix line 3 of bad.jsonl, then rerun with --restart (only the chunks whose input lines "
    "changed are encoded again)"
)


def test_bad_line_says_fix_that_line_then_restart(tmp_path, cli, tiny_checkpoint):
    line = _failed_line(cli, tmp_path, tiny_checkpoint, "bad.jsonl", [GOOD, GOOD, BAD, GOOD])
    assert line.startswith("bertattn encode: error: bad.jsonl: line 3: not valid JSON ("), line
    assert line.endswith(f"{FIX_3}: the 2 finished chunks are kept in r.npy.parts."), line
    assert "resume" not in line, line
    assert not (tmp_path / "r.npy").exists()
    # the advice works: fix the line, rerun with --restart
    _jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, GOOD, GOOD])
    again = _chunked(
        cli, tmp_path, tiny_checkpoint, "bad.jsonl", "-o", "r.npy", "--resumable", "--restart"
    )
    assert again.code == 0, again
    assert np.load(tmp_path / "r.npy").shape[0] == 4


def test_bad_first_line_does_not_claim_finished_chunks(tmp_path, cli, tiny_checkpoint):
    line = _failed_line(cli, tmp_path, tiny_checkpoint, "bad.jsonl", [BAD, GOOD])
    assert line.endswith(
        "Fix line 1 of bad.jsonl, then rerun with --restart (only the chunks whose input "
        "lines changed are encoded again)."
    ), line
    assert "kept" not in line and "finished chunk" not in line, line


@pytest.mark.parametrize(
    "code, fix",
    [
        (errno.ENOSPC, "Free disk space in r.npy.parts, then rerun the same command"),
        (errno.EDQUOT, "Free disk space in r.npy.parts, then rerun the same command"),
        (errno.EACCES, "Once that is fixed, rerun the same command"),
    ],
)
def test_os_error_writing_a_chunk_says_the_fix(
    tmp_path, cli, tiny_checkpoint, monkeypatch, code, fix
):
    """A full disk (simulated: the shard writer raises as ``write_atomic`` does) names the
    folder to free; another OSError its strerror and path."""
    import os

    original = ChunkStore.write_part

    def write_part(self, chunk, pieces, width, rank):  # type: ignore[no-untyped-def]
        if chunk.index >= 1:
            part = self.part(chunk.index)
            raise OSError(code, f"cannot write {part}: {os.strerror(code)}")
        return original(self, chunk, pieces, width, rank)

    monkeypatch.setattr(ChunkStore, "write_part", write_part)
    line = _failed_line(cli, tmp_path, tiny_checkpoint, "in.jsonl", [GOOD, GOOD, GOOD])
    assert f"cannot write r.npy.parts/chunk-00001.npy: {os.strerror(code)}" in line, line
    assert line.endswith(f"{fix}: the 1 finished chunk is kept in r.npy.parts."), line


def test_full_disk_before_any_chunk_says_nothing_is_kept(
    tmp_path, cli, tiny_checkpoint, monkeypatch
):
    def write_part(self, chunk, pieces, width, rank):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, f"cannot write {self.part(chunk.index)}: No space left")

    monkeypatch.setattr(ChunkStore, "write_part", write_part)
    line = _failed_line(cli, tmp_path, tiny_checkpoint, "in.jsonl", [GOOD, GOOD])
    assert line.endswith("Free disk space in r.npy.parts, then rerun the same command."), line
    assert "kept" not in line, line


def test_full_disk_writing_the_output_keeps_every_chunk(
    tmp_path, cli, tiny_checkpoint, monkeypatch
):
    import bertattn.jobs.encode as job

    def write_atomic(path, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, f"cannot write {path}: No space left on device")

    monkeypatch.setattr(job, "write_atomic", write_atomic)
    line = _failed_line(cli, tmp_path, tiny_checkpoint, "in.jsonl", [GOOD, GOOD])
    assert "cannot write r.npy: No space left on device. Free disk space in ." in line, line
    assert line.endswith(
        "then rerun the same command: every chunk is finished and kept in r.npy.parts, so the "
        "rerun only writes r.npy."
    ), line
    assert len(list((tmp_path / "r.npy.parts").glob("chunk-*.json"))) == 2


@pytest.mark.slow
def test_workers_report_a_bad_line_once(tmp_path, tiny_checkpoint, cli_subprocess):
    """Two ranks: the launcher says it once (the ranks leave it to the launcher)."""
    _jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, BAD, GOOD])
    got = cli_subprocess(
        "encode", "bad.jsonl", "-o", "w.npy", "--model", tiny_checkpoint,
        "--chunk-size", "16", "--workers", "2", env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert got.code == 1, got
    line = _error_line(got.err)
    assert line.startswith("bertattn encode: error: --workers 2: bad.jsonl: line 3: not valid"), (
        line
    )
    assert f"{FIX_3}: the " in line and line.endswith(" kept in w.npy.parts."), line
    assert got.err.count("not valid JSON") == 1, got


# ---------------------------------------------------------------------- 2. stale failure markers
@pytest.mark.slow
def test_failure_marker_of_an_earlier_run_is_not_reported_again(
    tmp_path, cli, tiny_checkpoint, cli_subprocess
):
    bad = _jsonl(tmp_path / "bad.jsonl", [GOOD, GOOD, BAD, GOOD])
    parts = tmp_path / "w.npy.parts"
    got = _chunked(cli, tmp_path, tiny_checkpoint, "bad.jsonl", "-o", "w.npy", "--resumable")
    assert got.code == 1 and list(parts.glob("failed-rank*.json")), got
    _jsonl(bad, [GOOD, GOOD, GOOD, GOOD])  # fixed: the rerun must say the input changed

    got = _chunked(cli, tmp_path, tiny_checkpoint, "bad.jsonl", "-o", "w.npy", "--resumable")
    assert got.code == 2, got
    assert not list(parts.glob("failed-rank*.json")), "the earlier run's marker was kept"
    one = _error_line(got.err)

    got = cli_subprocess(
        "encode", "bad.jsonl", "-o", "w.npy", "--model", tiny_checkpoint,
        "--chunk-size", "16", "--workers", "2", env=ENV, cwd=tmp_path,
    )  # fmt: skip
    assert got.code == 2, got  # as in one process
    line = _error_line(got.err)
    assert line.startswith("bertattn encode: error: --workers 2: the input file bad.jsonl "), line
    assert "changed since the interrupted run" in line and "pass --restart" in line, line
    assert "line 3" not in got.err and "not valid JSON" not in got.err, got
    assert line.split("--workers 2: ", 1)[1] == one.split("error: ", 1)[1]
    assert len(list(parts.glob("chunk-*.json"))) == 2  # nothing lost


# ---------------------------------------------------------------------- 3. a plain run vs a lock
def test_plain_run_refused_while_a_chunked_run_holds_the_parts_folder(
    tmp_path, cli, tiny_checkpoint
):
    (tmp_path / "in.txt").write_text("hello world\nsecond line\n", encoding="utf-8")
    parts = tmp_path / "o.npy.parts"
    parts.mkdir()
    args = ["encode", "in.txt", "-o", "o.npy", "--model", tiny_checkpoint]
    lock = FolderLock(parts, what="o.npy.parts").acquire()  # as a live resumable run holds it
    try:
        plain = cli(*args, cwd=tmp_path)
        second = cli(*args, "--resumable", cwd=tmp_path)
    finally:
        lock.release()
    assert plain.code == 2, plain
    line = _error_line(plain.err)
    assert "another bertattn run (process " in line and "is writing o.npy.parts" in line, line
    assert line == _error_line(second.err)  # what a second resumable run is told
    assert "warning" not in plain.err, plain
    assert not (tmp_path / "o.npy").exists()

    got = cli(*args, cwd=tmp_path)  # not held: really interrupted: a warning, then the work
    assert got.code == 0, got
    assert "o.npy.parts holds the chunks of an interrupted chunked run; this run ignores it" in (
        got.err
    )
    assert (tmp_path / "o.npy").is_file()


# ---------------------------------------------------------------------- 4. a sharded folder reused
def test_finished_sharded_folder_reused_for_another_input(tmp_path, cli, tiny_checkpoint):
    (tmp_path / "a.txt").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "other.txt").write_text("three\nfour\n", encoding="utf-8")
    got = cli("encode", "a.txt", "-o", "shards/", "--model", tiny_checkpoint, cwd=tmp_path)
    assert got.code == 0, got
    index = (tmp_path / "shards" / "index.json").read_bytes()
    got = cli("encode", "other.txt", "-o", "shards/", "--model", tiny_checkpoint, cwd=tmp_path)
    assert got.code == 2, got
    line = _error_line(got.err)
    assert line.endswith(
        "shards/ holds the finished output of another input (a.txt then, other.txt now); choose "
        "another folder, or pass --restart to replace it."
    ), line
    assert "interrupted" not in line, line
    assert (tmp_path / "shards" / "index.json").read_bytes() == index  # nothing lost


def test_interrupted_sharded_folder_names_the_files_that_differ(tmp_path, cli, tiny_checkpoint):
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "other.txt").write_text("three\nfour\n", encoding="utf-8")
    base = ["-o", "shards/", "--model", tiny_checkpoint, "--chunk-size", "4"]
    got = cli("encode", "a.txt", *base, env={"BERTATTN_TEST_FAIL_CHUNK": "1"}, cwd=tmp_path)
    assert got.code == 1, got
    got = cli("encode", "other.txt", *base, cwd=tmp_path)
    assert got.code == 2, got
    line = _error_line(got.err)
    assert "the input files differ from the interrupted run's (a.txt then, other.txt now)" in (
        line
    ), line
    assert (
        "pass --restart to start over, keeping the finished chunks in shards whose input bytes "
        "are unchanged" in line
    ), line


def test_a_missing_chunk_at_the_end_is_explained_not_a_bug(tmp_path):
    """The last step finds a chunk gone (deleted by hand): a JobError (one line, exit 1), not a
    RuntimeError (which the command line shows as a bug, with its traceback)."""
    from bertattn.distributed.plan import Chunk
    from bertattn.distributed.store import ChunkStore
    from bertattn.errors import JobError

    store = ChunkStore(tmp_path / "parts")
    store.path.mkdir()
    chunks = [Chunk(0, 0, 0, 10, "a.txt"), Chunk(1, 0, 10, 20, "a.txt")]
    with pytest.raises(JobError, match=r"cannot finish: 2 chunk\(s\) missing or incomplete"):
        store.index(chunks, ["a.txt"], 4)
