"""`bertattn encode` end to end: in process (`bertattn.cli.main`), and as a real process
(`python -m bertattn encode ...`) where a signal must reach it."""

from __future__ import annotations

import json
import os
import select
import signal
import time

import numpy as np
import pytest

from bertattn import Bert
from bertattn.errors import UsageError
from bertattn.files import check_output, write_atomic
from bertattn.jobs import read_texts
from bertattn.jobs.encode import embeddings_payload

LONG = " ".join(["supercalifragilistic expialidocious"] * 200)  # far over 256 tokens
LINES = ["The first line.", "", "A second, longer line about attention heads.", LONG, "ok"]


@pytest.fixture(scope="module")
def bert():
    return Bert.load()


@pytest.mark.slow
def test_text_file_to_npy_and_jsonl(tmp_path, bert, cli):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    proc = cli("encode", src, "-o", out, "--batch-size", "2")
    err = proc.err
    assert proc.code == 0, proc
    assert "Traceback" not in err
    assert "5 texts (1 empty, 1 truncated to 256 tokens)" in err
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (5, 384)
    with pytest.warns(UserWarning, match="1 of 5 inputs were longer than max_length=256"):
        want = bert.encode(LINES)
    np.testing.assert_allclose(got, want, atol=1e-5)

    out_jsonl = tmp_path / "out.jsonl"
    proc = cli("encode", src, "-o", out_jsonl, "--pooling", "cls", "--no-normalize")
    assert proc.code == 0, proc
    rows = [json.loads(line) for line in out_jsonl.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(5))
    with pytest.warns(UserWarning, match="truncated"):
        want = bert.encode(LINES, pooling="cls", normalize=False)
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), want, rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.jsonl", "out.npy"]


@pytest.mark.slow
def test_jsonl_input_with_field_from_stdin(tmp_path, bert, cli):
    texts = ["alpha beta", "", "gamma"]
    data = "".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts))
    out = tmp_path / "o.npy"
    proc = cli("encode", "-", "-o", out, "--field", "body", "--max-length", "8", input=data)
    assert proc.code == 0, proc
    np.testing.assert_allclose(np.load(out), bert.encode(texts, max_length=8), atol=1e-5)
    src = tmp_path / "in.jsonl"
    src.write_text(data)
    proc = cli("encode", src, "-o", out)  # .jsonl input: field 'text' by default
    assert proc.code == 1, proc
    assert "line 1: no field 'text' (found: id, body); choose it with --field" in proc.err


def _fifo_with(path, data: bytes):  # type: ignore[no-untyped-def]
    """A named pipe at ``path`` and a thread that writes ``data`` into it once a reader opens
    it (as ``<(command)`` does); join the returned thread after the run."""
    import threading

    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as f:  # blocks until the job opens the pipe
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


@pytest.mark.slow
def test_a_pipe_is_read_once_like_stdin(tmp_path, bert, cli):
    """``bertattn encode <(zcat texts.gz) -o out.npy``: the pipe is read front to back once,
    as stdin is (plain lines, or JSON lines by --field / a .jsonl name), with the same
    output as the same lines from a file."""
    texts = ["alpha beta", "", "gamma delta"]
    pipe = tmp_path / "texts"
    writer = _fifo_with(pipe, ("\n".join(texts) + "\n").encode())
    out = tmp_path / "o.npy"
    proc = cli("encode", pipe, "-o", out, "--max-length", "8")
    writer.join(timeout=30)
    assert proc.code == 0, proc
    assert "3 texts (1 empty" in proc.err
    np.testing.assert_allclose(np.load(out), bert.encode(texts, max_length=8), atol=1e-5)

    rows = "".join(json.dumps({"n": 10 + i, "text": t}) + "\n" for i, t in enumerate(texts))
    writer = _fifo_with(tmp_path / "rows.jsonl", rows.encode())
    out = tmp_path / "o.jsonl"
    proc = cli("encode", tmp_path / "rows.jsonl", "-o", out, "--id-field", "n", "--max-length", "8")
    writer.join(timeout=30)
    assert proc.code == 0, proc
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in got] == [10, 11, 12]
    want = bert.encode(texts, max_length=8)
    np.testing.assert_allclose(np.array([r["embedding"] for r in got]), want, atol=1e-5)


def test_a_pipe_cannot_feed_a_chunked_run(tmp_path, cli):
    """Every rank, and a rerun, must read the input again: a pipe (like stdin) is refused
    before it is opened (its writer is not consumed), naming it and the fix."""
    pipe = tmp_path / "texts"
    os.mkfifo(pipe)
    proc = cli("encode", pipe, "-o", tmp_path / "o.npy", "--resumable")
    assert proc.code == 2, proc
    assert f"cannot read {pipe} (a pipe or a device)" in proc.err
    assert "write it to a file first" in proc.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts"]


def test_invalid_utf8(tmp_path, cli):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"fine\nalso fine\nbroken \xff\xfe here\n")
    out = tmp_path / "out.npy"
    proc = cli("encode", src, "-o", out)
    err = proc.err
    assert proc.code == 1, proc
    assert err.startswith("bertattn encode: error:") and "Traceback" not in err
    assert f"{src}: line 3: invalid UTF-8" in err
    assert not out.exists()


def test_missing_model_and_corrupt_weights(tmp_path, minilm_dir, cli):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    for command in (["encode", src, "-o", tmp_path / "o.npy"], ["attend", "hello"]):
        # a mistyped --model is a usage error, as a missing input file is
        proc = cli(*command, "--model", tmp_path / "nomodel")
        assert proc.code == 2, proc
        assert f"model folder {tmp_path / 'nomodel'} does not exist" in proc.err
    empty = tmp_path / "empty"  # a folder that exists but is not a model: a runtime error
    empty.mkdir()
    proc = cli("encode", src, "-o", tmp_path / "o.npy", "--model", empty)
    assert proc.code == 1 and "config.json" in proc.err, proc
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        (broken / name).write_text((minilm_dir / name).read_text())
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}garbage")
    proc = cli("encode", src, "-o", tmp_path / "o.npy", "--model", broken)
    err = proc.err
    assert proc.code == 1 and "Traceback" not in err, proc
    assert f"cannot read weights file {broken / 'model.safetensors'}" in err
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_interrupted_run_leaves_no_output(tmp_path, sig, cli_subprocess):
    src = tmp_path / "big.txt"
    line = "a moderately long sentence about multi-head self-attention in BERT encoders"
    src.write_text("\n".join(f"{i} {line} {i}" for i in range(20000)) + "\n")
    out = tmp_path / "out.npy"
    seen = b""
    deadline = time.monotonic() + 120
    argv = ("encode", src, "-o", out, "--batch-size", "4", "--progress")  # a bar on a pipe too
    with cli_subprocess.popen(*argv) as proc:
        while b"token/s]" not in seen:  # the progress bar is running
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk or proc.poll() is None, seen.decode(errors="replace")
                seen += chunk
        proc.send_signal(sig)
        rest = proc.communicate(timeout=60)[1]
    assert proc.returncode != 0
    if sig != signal.SIGKILL:  # a catchable signal: clean exit code and message, no traceback
        assert proc.returncode in (130, 143)
        assert b"Traceback" not in rest
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["big.txt"]


def test_read_and_write_pieces(tmp_path):
    src = tmp_path / "t.txt"
    src.write_bytes(b"a\r\n\nb")
    assert read_texts(src) == ["a", "", "b"]
    emb = np.arange(6, dtype=np.float32).reshape(3, 2) / 7
    out = write_atomic(tmp_path / "e.jsonl", embeddings_payload(tmp_path / "e.jsonl", emb))
    rows = [json.loads(x)["embedding"] for x in out.read_text().splitlines()]
    np.testing.assert_array_equal(np.array(rows, dtype=np.float32), emb)
    with pytest.raises(UsageError, match=r"unknown format '\.csv'.* use \.npy or \.jsonl"):
        check_output(tmp_path / "e.csv", suffixes=(".npy", ".jsonl"))
