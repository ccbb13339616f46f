"""An input file edited while a run is going: the run fails (exit 1, naming the file) instead
of writing an index (or an output file) whose rows mix old and new lines; its finished chunks
are kept, and ``--restart`` reuses the unchanged ones, never a chunk whose rows were read from
other bytes than its recorded digest. In process, tiny checkpoint."""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

from bertattn.corpus import open_embeddings
from bertattn.distributed import ChunkStore


def _text(n: int, tag: str = "line") -> bytes:
    return b"".join(b"%s number %d of the input\n" % (tag.encode(), i) for i in range(n))


def _edit_after_first_chunk(monkeypatch, edit) -> None:
    """Run ``edit()`` once, right after the run's first chunk is written."""
    write_part = ChunkStore.write_part
    done = []

    def patched(self, chunk, pieces, width, rank):  # type: ignore[no-untyped-def]
        record = write_part(self, chunk, pieces, width, rank)
        if not done:
            done.append(chunk.index)
            edit()
        return record

    monkeypatch.setattr(ChunkStore, "write_part", patched)


def _rewrite_last_lines(path) -> None:
    """Lines 90.. rewritten with the same length (size unchanged), mtime moved on."""
    data = path.read_bytes()
    at = data.index(b"line number 90 ")
    path.write_bytes(data[:at] + data[at:].replace(b"line", b"LINE"))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.mark.parametrize("how", ["append", "rewrite"])
@pytest.mark.parametrize("sharded", [True, False])
def test_input_changed_during_the_run_fails_and_keeps_the_chunks(
    tmp_path, cli, tiny_checkpoint, monkeypatch, how, sharded
):
    src = tmp_path / "in.txt"
    src.write_bytes(_text(100))
    out = f"{tmp_path / 'sh'}/" if sharded else tmp_path / "o.npy"
    folder = tmp_path / ("sh" if sharded else "o.npy.parts")
    edits = {
        "append": lambda: src.write_bytes(_text(100) + _text(20, "more")),
        "rewrite": lambda: _rewrite_last_lines(src),
    }
    _edit_after_first_chunk(monkeypatch, edits[how])
    argv = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-size", "600"]
    if not sharded:
        argv.append("--resumable")
    r = cli(*argv)
    assert r.code == 1, r
    assert "Traceback" not in r.err, r.err
    assert re.search(rf"input {re.escape(str(src))} \(.*\) changed while the run", r.err), r.err
    assert "--restart" in r.err, r.err
    assert not (tmp_path / "sh" / "index.json").exists() and not (tmp_path / "o.npy").exists()
    chunks = sorted(folder.glob("chunk-*.npy"))
    assert len(chunks) >= 4, chunks  # every chunk finished, and kept
    monkeypatch.undo()  # --restart: the unchanged chunks kept, the rest computed again
    r = cli(*argv, "--restart")
    assert r.code == 0, r
    m = re.search(r"(\d+) computed, (\d+) reused", r.err)
    assert m and int(m.group(2)) >= 1, r.err
    ref = tmp_path / "ref.npy"
    assert cli("encode", src, "-o", ref, "--model", tiny_checkpoint).code == 0
    got = open_embeddings(tmp_path / "sh").to_numpy() if sharded else np.load(tmp_path / "o.npy")
    np.testing.assert_allclose(got, np.load(ref), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_workers_notice_an_input_changed_during_the_run(tmp_path, cli_subprocess, tiny_checkpoint):
    src = tmp_path / "in.txt"
    src.write_bytes(_text(100))
    folder = tmp_path / "sh"

    def edit_once_a_chunk_is_finished() -> None:
        deadline = time.monotonic() + 120
        while not list(folder.glob("chunk-*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        _rewrite_last_lines(src)

    editor = threading.Thread(target=edit_once_a_chunk_is_finished, daemon=True)
    editor.start()
    r = cli_subprocess(
        "encode",
        src,
        "-o",
        f"{folder}/",
        "--model",
        tiny_checkpoint,
        "--chunk-size",
        "600",
        "--workers",
        "2",
        env={"OMP_NUM_THREADS": "1", "BERTATTN_TEST_CHUNK_DELAY": "1"},
    )
    editor.join()
    assert r.code == 1, r
    assert f"input {src} (" in r.err and "changed while the run" in r.err, r.err
    assert "Traceback" not in r.err and not (folder / "index.json").exists(), r.err


def test_input_changed_while_a_single_run_reads_it(tmp_path, cli, tiny_checkpoint, monkeypatch):
    """One process reads the whole input first: an edit during that read is caught too."""
    from bertattn.corpus import lines

    src = tmp_path / "in.txt"
    src.write_bytes(_text(100))
    read_corpus = lines.read_corpus

    def read_then_edit(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = read_corpus(*args, **kwargs)
        src.write_bytes(_text(100) + _text(5, "more"))
        return out

    monkeypatch.setattr(lines, "read_corpus", read_then_edit)
    r = cli("encode", src, "-o", tmp_path / "o.npy", "--model", tiny_checkpoint)
    assert r.code == 1, r
    assert f"input {src} (size, mtime_ns" in r.err and "changed while it was read" in r.err, r.err
    assert not (tmp_path / "o.npy").exists()


def test_chunk_read_after_an_edit_is_not_kept_by_restart(
    tmp_path, cli, tiny_checkpoint, monkeypatch
):
    """The edit lands between a chunk's digest (recorded, what --restart compares) and the
    read of its lines: its rows are of other bytes than its digest says, so it must not be
    finished with that digest, or --restart would keep wrong rows for the unchanged bytes."""
    from bertattn.distributed import runner

    src = tmp_path / "in.txt"
    src.write_bytes(_text(100))
    real = runner.chunk_sha256
    calls = []

    def digest_then_edit(source, chunk, **kw):  # type: ignore[no-untyped-def]
        digest = real(source, chunk, **kw)
        calls.append(chunk.index)
        if chunk.index == 2 and calls.count(2) == 1:  # a line inserted at the top, once:
            # longer than a chunk, so it is a chunk of its own and the old chunks come back
            # whole, one index later, for --restart to find by their digests
            src.write_bytes(b"an inserted line " * 40 + b"\n" + _text(100))
        return digest

    monkeypatch.setattr(runner, "chunk_sha256", digest_then_edit)
    out = f"{tmp_path / 'sh'}/"
    argv = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-size", "600"]
    r = cli(*argv)
    assert r.code == 1, r
    assert f"on chunk 2 ({src} bytes" in r.err, r.err
    assert f"{src} changed while the chunk was read" in r.err and "--restart" in r.err, r.err
    monkeypatch.undo()
    r = cli(*argv, "--restart")
    assert r.code == 0, r
    ref = tmp_path / "ref.npy"
    assert cli("encode", src, "-o", ref, "--model", tiny_checkpoint).code == 0
    got = open_embeddings(tmp_path / "sh").to_numpy()
    assert got.shape == np.load(ref).shape
    np.testing.assert_allclose(got, np.load(ref), rtol=0, atol=1e-5)
