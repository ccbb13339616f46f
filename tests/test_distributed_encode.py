"""Distributed, resumable `bertattn encode`: chunk planning and balance (in process), then real
multi-process runs (torchrun / --workers on gloo, CPU) as subprocesses: equality with one
process, crash and resume, refused manifests, a failing rank."""

from __future__ import annotations

import gzip
import os
import random
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from bertattn.corpus import InputFile
from bertattn.corpus.lines import read_blocks
from bertattn.distributed import ChunkStore, auto_chunk_bytes, make_chunks
from bertattn.distributed.plan import check_partition
from bertattn.errors import JobError, UsageError
from bertattn.jobs import EncodeOptions, run_encode

WORDS = "the attention head looks at every token in the sentence and weighs it".split()
LONG = " ".join(["supercalifragilistic expialidocious"] * 100)  # over 256 tokens: truncated


#: what every process of these tests gets on top of the shared environment (conftest.py)
ENV = {"OMP_NUM_THREADS": "1"}


def _skewed_lines(n_short: int, n_long: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(n_short)]
    lines[3] = ""  # an empty line is a row too
    for _ in range(n_long):
        lines.insert(rng.randrange(len(lines)), LONG)
    return lines


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _summary(stderr: str) -> tuple[int, int]:
    m = re.search(r"chunks: (\d+) computed, (\d+) reused", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2))


def _rank_chunks(stderr: str) -> list[int]:
    m = re.search(r"chunks per rank: ([\d, ]+)", stderr)
    assert m, stderr
    return [int(x) for x in m.group(1).split(",")]


# ---------------------------------------------------------------------- planning, in process
def _awkward_bytes(rng: random.Random) -> bytes:
    """Lines as they come: CRLF and LF, empty lines, a long line, non-ASCII, maybe no final
    newline."""
    lines = []
    for _ in range(rng.randint(0, 60)):
        kind = rng.random()
        if kind < 0.1:
            lines.append("")
        elif kind < 0.15:
            lines.append("注意力 " * rng.randint(50, 400))
        else:
            lines.append(" ".join(rng.choices(WORDS, k=rng.randint(1, 12))))
    data = "".join(line + rng.choice(["\n", "\r\n"]) for line in lines).encode()
    if data and rng.random() < 0.3:
        data = data.rstrip(b"\n").rstrip(b"\r")
    return data


def _reference(data: bytes) -> list[str]:
    out = data.split(b"\n")
    if out and out[-1] == b"":
        out.pop()
    return [x[:-1].decode() if x.endswith(b"\r") else x.decode() for x in out]


@pytest.mark.parametrize("seed", range(25))
def test_byte_range_chunks_cover_every_line_once(seed, tmp_path):
    """Cuts land after a newline; the chunks' texts, read one by one, are the file's lines,
    in order, whatever the chunk size (1 byte to larger than the file)."""
    rng = random.Random(seed)
    data = _awkward_bytes(rng)
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    src = InputFile.stat(path)
    for size in (1, 7, 100, 4096, 10**9):
        chunks = make_chunks([src], size)
        check_partition(chunks, [src])
        assert all(data[c.end - 1 : c.end] == b"\n" or c.end == len(data) for c in chunks)
        texts = [t for c in chunks for b in read_blocks(src, c.start, c.end) for t in b.texts]
        assert texts == _reference(data), size
    assert make_chunks([src], 100) == make_chunks([src], 100)  # deterministic


def test_compressed_file_is_one_chunk_and_empty_file_none(tmp_path):
    (tmp_path / "a.txt").write_text("x\n" * 100)
    (tmp_path / "b.txt").write_text("")
    with gzip.open(tmp_path / "c.txt.gz", "wt") as f:
        f.write("y\n" * 1000)
    files = [InputFile.stat(tmp_path / n) for n in ("a.txt", "b.txt", "c.txt.gz")]
    chunks = make_chunks(files, 50)
    assert [(c.file, c.start, c.end) for c in chunks] == [
        (0, 0, 50),
        (0, 50, 100),
        (0, 100, 150),
        (0, 150, 200),
        (2, 0, files[2].size),
    ]
    with pytest.raises(ValueError, match="inconsistent at chunk 1"):
        check_partition([chunks[0], *chunks[2:]], files)
    with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
        make_chunks(files, 0)
    assert auto_chunk_bytes(10) == 64 << 10 and auto_chunk_bytes(10**12) == 32 << 20
    assert auto_chunk_bytes(256 << 20) == 1 << 20  # total / 256 in between


def test_stdin_is_refused(tmp_path):
    with pytest.raises(UsageError, match="cannot read stdin"):
        EncodeOptions("-", str(tmp_path / "o.npy"), resumable=True)


# ---------------------------------------------------------------------- real runs
@pytest.mark.slow
def test_two_ranks_equal_one_rank_and_balanced(tmp_path, minilm_dir, cli, cli_subprocess):
    """torchrun, 2 ranks on gloo, MiniLM, a skewed file (long truncated lines + short ones
    + an empty one): same rows, same order as one process, ≤ 1e-6; both ranks took chunks.
    The one process is this one (``cli``): the reference needs no process of its own."""
    lines = _skewed_lines(200, 6)
    src = _write(tmp_path / "in.txt", lines)
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    proc = cli("encode", src, "-o", one, "--model", minilm_dir, env=ENV)
    assert proc.code == 0, proc
    proc = cli_subprocess.torchrun(
        2, "encode", src, "-o", two, "--model", minilm_dir, "--chunk-size", "2K", env=ENV
    )
    assert proc.code == 0, proc
    a, b = np.load(one), np.load(two)
    assert a.shape == b.shape == (len(lines), 384)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert np.abs(b[3]).max() > 0  # the empty line's row is there, at its place
    assert not (tmp_path / "two.npy.parts").exists()
    assert "2 rank(s)" in proc.err and "padding" in proc.err and "sentences/s" in proc.err
    assert f"{len(lines)} lines (1 empty, 6 truncated to 256 tokens)" in proc.err
    per_rank = _rank_chunks(proc.err)  # handed out one at a time: both ranks took some
    assert len(per_rank) == 2 and min(per_rank) > 0 and sum(per_rank) > 4, per_rank


def _descendants_with_rank(pid: int, rank: str) -> list[int]:
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == rank:
                found.append(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.slow
def test_killed_rank_then_resume(tmp_path, tiny_checkpoint, cli, cli_subprocess):
    """SIGKILL rank 1 once some parts exist: the run fails (no output, parts kept); the rerun
    finishes, reuses exactly the parts that existed, and equals an uninterrupted run."""
    src = _write(tmp_path / "in.txt", _skewed_lines(300, 4))
    common = ["--model", tiny_checkpoint, "--chunk-size", "1K"]
    ref = tmp_path / "ref.npy"  # uninterrupted, in this process: the same chunks, the same bytes
    proc = cli("encode", src, "-o", ref, *common, "--resumable", env=ENV)
    assert proc.code == 0, proc
    computed, reused = _summary(proc.err)
    assert reused == 0 and computed > 12

    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    two = ["--workers", "2"]
    with cli_subprocess.popen(
        "encode",
        src,
        "-o",
        out,
        *common,
        *two,
        env={**ENV, "BERTATTN_TEST_CHUNK_DELAY": "0.4"},
        text=True,
    ) as launcher:
        deadline = time.monotonic() + 120
        while len(list(parts.glob("chunk-*.json"))) < 3:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.05)
        victims = _descendants_with_rank(launcher.pid, "1")
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        err = launcher.communicate(timeout=120)[1]
    # one line from the launcher names the rank and the signal (the stopped ranks say nothing,
    # and the launcher, which no signal reached, does not say it was stopped by one)
    assert launcher.returncode == 1, err
    lines = [line for line in err.splitlines() if line.startswith("bertattn")]
    assert lines[-1] == (
        "bertattn encode: error: --workers 2: rank 1 was killed by SIGKILL (the out-of-memory "
        "killer sends it too: see dmesg); the other ranks were stopped. Rerun the same command "
        f"to resume: the finished chunks are kept in {parts}."
    ), err
    assert not any("signal" in line or "stopped (" in line for line in lines[:-1]), err
    assert "Traceback" not in err, err
    assert not out.exists()
    done = len(list(parts.glob("chunk-*.json")))
    assert 3 <= done < computed

    proc = cli_subprocess("encode", src, "-o", out, *common, *two, env=ENV)
    assert proc.code == 0, proc
    assert f"({done} done before)" in proc.err
    assert _summary(proc.err) == (computed - done, done)
    np.testing.assert_array_equal(np.load(out), np.load(ref))
    assert not parts.exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_changed_input_model_or_settings_refused_then_restart(
    tmp_path, tiny_checkpoint, tiny_checkpoint_factory, monkeypatch, cli_subprocess
):
    src = _write(tmp_path / "in.txt", _skewed_lines(120, 2))
    out = tmp_path / "out.npy"
    kw = dict(model=str(tiny_checkpoint), chunk_size="1K", resumable=True)  # in process

    def chunked(**over):
        return run_encode(EncodeOptions(str(src), str(out), **{**kw, **over}))

    monkeypatch.setenv("BERTATTN_TEST_FAIL_CHUNK", "2")
    with pytest.raises(JobError, match=r"rank 0 failed on chunk 2 \(.*in.txt bytes .* injected"):
        chunked()
    monkeypatch.delenv("BERTATTN_TEST_FAIL_CHUNK")
    assert not out.exists()
    assert sorted(p.name for p in (tmp_path / "out.npy.parts").glob("chunk-*.npy")) == [
        "chunk-00000.npy",
        "chunk-00001.npy",
    ]

    base = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-size", "1K"]
    proc = cli_subprocess(*base, "--resumable", "--pooling", "cls", env=ENV)  # HF folder: mean
    assert proc.code == 2, proc
    assert "the settings changed since the interrupted run (pooling 'mean' -> 'cls')" in proc.err
    assert "pass --restart to discard the finished chunks in" in proc.err

    other = tiny_checkpoint_factory(seed=1)
    with pytest.raises(UsageError, match=r"the model changed since the interrupted run \(files"):
        chunked(model=str(other))
    changed = _write(tmp_path / "in.txt", _skewed_lines(120, 2) + ["one more line"])
    with pytest.raises(UsageError, match=r"the input file .*in.txt changed .* \(size, .*--restart"):
        chunked()
    assert not out.exists()

    proc = cli_subprocess(*base, "--pooling", "cls", "--restart", env=ENV)  # implies --resumable
    assert proc.code == 0, proc
    assert _summary(proc.err)[1] == 0
    plain = tmp_path / "plain.npy"
    run_encode(EncodeOptions(str(changed), str(plain), model=str(tiny_checkpoint), pooling="cls"))
    np.testing.assert_allclose(np.load(out), np.load(plain), rtol=0, atol=1e-6)
    assert not (tmp_path / "out.npy.parts").exists()


@pytest.mark.slow
def test_failing_rank_fails_the_run(tmp_path, tiny_checkpoint, cli_subprocess):
    src = _write(tmp_path / "in.txt", _skewed_lines(150, 2))
    out = tmp_path / "out.npy"
    args = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-size", "512"]
    proc = cli_subprocess(*args, "--workers", "2", env={**ENV, "BERTATTN_TEST_FAIL_CHUNK": "3"})
    assert proc.code != 0
    assert proc.code == 1 and "Traceback" not in proc.err, proc
    last = proc.err.strip().splitlines()[-1]  # one bertattn line names the rank and chunk
    assert last.startswith("bertattn encode: error: --workers 2: rank "), proc
    assert "on chunk 3 (" in last and "in.txt bytes" in last, proc
    assert "BERTATTN_TEST_FAIL_CHUNK=3" in last
    assert not out.exists()
    manifest = ChunkStore.for_output(out, sharded=False).read_manifest()
    assert manifest is not None and len(manifest["chunks"]) > 3
    proc = cli_subprocess(*args, "--workers", "2", env=ENV)  # the rerun completes what is missing
    assert proc.code == 0, proc
    assert np.load(out).shape == (152, 32)


@pytest.mark.slow
def test_ctrl_c_during_workers_exits_130(tmp_path, tiny_checkpoint, cli_subprocess):
    """SIGINT to the whole process group (a terminal's Ctrl-C) while two ranks work: 130, no
    traceback, no output, the finished chunks kept for a rerun."""
    src = _write(tmp_path / "in.txt", _skewed_lines(300, 2))
    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    argv = ["encode", src, "-o", out]
    argv += ["--model", tiny_checkpoint, "--chunk-size", "1K", "--workers", "2"]
    env = {**ENV, "BERTATTN_TEST_CHUNK_DELAY": "0.4"}
    with cli_subprocess.popen(*argv, env=env, text=True) as proc:  # a session of its own
        deadline = time.monotonic() + 120
        while len(list(parts.glob("chunk-*.json"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().endswith("bertattn encode: interrupted"), err
    assert not out.exists() and len(list(parts.glob("chunk-*.json"))) >= 2
