"""Distributed, resumable `bertattn encode`: chunk planning and balance (in process), then real
multi-process runs (torchrun / --workers on gloo, CPU) as subprocesses: equality with one
process, crash and resume, refused manifests, a failing rank."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from bertattn.distributed import (
    Chunk,
    PartsFolder,
    assign_chunks,
    chunk_token_target,
    make_chunks,
)
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


def _rank_tokens(stderr: str) -> list[int]:
    m = re.search(r"tokens per rank: ([\d, ]+)", stderr)
    assert m, stderr
    return [int(x) for x in m.group(1).split(",")]


# ---------------------------------------------------------------------- planning, in process
def test_chunks_partition_the_lines():
    rng = random.Random(1)
    counts = [rng.choice([2, 5, 9, 40, 256]) for _ in range(1000)]
    for target in (1, 100, 1000, 10**6):
        chunks = make_chunks(counts, target)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert chunks[0].start == 0 and chunks[-1].end == len(counts)
        assert all(a.end == b.start for a, b in zip(chunks, chunks[1:], strict=False))
        assert all(c.tokens == sum(counts[c.start : c.end]) for c in chunks)
        assert all(c.tokens <= target or c.lines == 1 for c in chunks)
    assert make_chunks([], 10) == []
    assert chunk_token_target(640_000) == 10_000  # total / 64
    assert chunk_token_target(10) == 8192 and chunk_token_target(10**9) == 65536
    with pytest.raises(ValueError, match="chunk_tokens must be a positive int"):
        chunk_token_target(10, 0)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_assignment_balances_tokens_not_lines(world):
    """A few very long lines among many short ones: lines per rank differ a lot, tokens per
    rank stay within 20% of the mean; every chunk goes to exactly one rank; deterministic."""
    rng = random.Random(world)
    counts = [rng.randint(3, 14) for _ in range(3000)]
    for i in rng.sample(range(3000), 40):
        counts[i] = 256
    chunks = make_chunks(counts, 1000)  # ~37 chunks
    ranks = assign_chunks(chunks, world)
    assert ranks == assign_chunks(chunks, world)
    assert sorted(c.index for mine in ranks for c in mine) == list(range(len(chunks)))
    tokens = [sum(c.tokens for c in mine) for mine in ranks]
    mean = sum(tokens) / world
    assert all(abs(t - mean) <= 0.2 * mean for t in tokens), tokens
    # the greedy is on tokens: one huge chunk fills a rank that gets nothing else
    big = [Chunk(0, 0, 1, 900), *(Chunk(i, i, i + 1, 100) for i in range(1, 10))]
    assert [[c.index for c in mine] for mine in assign_chunks(big, 2)] == [
        [0],
        list(range(1, 10)),
    ]


def test_stdin_is_refused(tmp_path):
    with pytest.raises(UsageError, match="cannot read stdin"):
        EncodeOptions("-", str(tmp_path / "o.npy"), resumable=True)


# ---------------------------------------------------------------------- real runs
@pytest.mark.slow
def test_two_ranks_equal_one_rank_and_balanced(tmp_path, minilm_dir, cli_subprocess):
    """torchrun, 2 ranks on gloo, MiniLM, a skewed file (long truncated lines + short ones
    + an empty one): same rows, same order as one process, ≤ 1e-6; tokens balanced."""
    lines = _skewed_lines(200, 6)
    src = _write(tmp_path / "in.txt", lines)
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    proc = cli_subprocess("encode", src, "-o", one, "--model", minilm_dir, env=ENV)
    assert proc.code == 0, proc
    proc = cli_subprocess.torchrun(
        2, "encode", src, "-o", two, "--model", minilm_dir, "--chunk-tokens", "256", env=ENV
    )
    assert proc.code == 0, proc
    a, b = np.load(one), np.load(two)
    assert a.shape == b.shape == (len(lines), 384)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert np.abs(b[3]).max() > 0  # the empty line's row is there, at its place
    assert not (tmp_path / "two.npy.parts").exists()
    assert "2 rank(s)" in proc.err and "padding" in proc.err and "sentences/s" in proc.err
    assert f"{len(lines)} lines (1 empty, 6 truncated to 256 tokens)" in proc.err
    tokens = _rank_tokens(proc.err)
    mean = sum(tokens) / 2
    assert len(tokens) == 2 and all(abs(t - mean) <= 0.2 * mean for t in tokens), tokens


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
def test_killed_rank_then_resume(tmp_path, tiny_checkpoint, cli_subprocess):
    """SIGKILL rank 1 once some parts exist: the run fails (no output, parts kept); the rerun
    finishes, reuses exactly the parts that existed, and equals an uninterrupted run."""
    src = _write(tmp_path / "in.txt", _skewed_lines(300, 4))
    common = ["--model", tiny_checkpoint, "--chunk-tokens", "150"]
    ref = tmp_path / "ref.npy"  # uninterrupted, one process: the same chunks, the same bytes
    proc = cli_subprocess("encode", src, "-o", ref, *common, "--resumable", env=ENV)
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
        while len(list(parts.glob("chunk-*.npy"))) < 3:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.05)
        victims = _descendants_with_rank(launcher.pid, "1")
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        err = launcher.communicate(timeout=120)[1]
    assert launcher.returncode != 0, err
    assert re.search(r"stopped \(SystemExit\): \d+ chunk\(s\) not written: \d", err), err
    assert not out.exists()
    done = len(list(parts.glob("chunk-*.npy")))
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
    kw = dict(model=str(tiny_checkpoint), chunk_tokens=200, resumable=True)  # in process

    def chunked(**over):
        return run_encode(EncodeOptions(str(src), str(out), **{**kw, **over}))

    monkeypatch.setenv("BERTATTN_TEST_FAIL_CHUNK", "2")
    with pytest.raises(JobError, match=r"rank 0 failed on chunk 2 \(lines .* injected failure"):
        chunked()
    monkeypatch.delenv("BERTATTN_TEST_FAIL_CHUNK")
    assert not out.exists()
    assert sorted(p.name for p in (tmp_path / "out.npy.parts").glob("*.npy")) == [
        "chunk-00000.npy",
        "chunk-00001.npy",
    ]

    base = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-tokens", "200"]
    proc = cli_subprocess(*base, "--resumable", "--pooling", "mean", env=ENV)  # HF folder: cls
    assert proc.code == 2, proc
    assert "the settings changed since the interrupted run (pooling 'cls' -> 'mean')" in proc.err
    assert "pass --restart to discard the finished chunks in" in proc.err

    other = tiny_checkpoint_factory(seed=1)
    with pytest.raises(UsageError, match=r"the model changed since the interrupted run \(files"):
        chunked(model=str(other))
    changed = _write(tmp_path / "in.txt", _skewed_lines(120, 2) + ["one more line"])
    with pytest.raises(UsageError, match=r"the input file changed .* \(sha256 .* --restart"):
        chunked()
    assert not out.exists()

    proc = cli_subprocess(*base, "--pooling", "mean", "--restart", env=ENV)  # implies --resumable
    assert proc.code == 0, proc
    assert _summary(proc.err)[1] == 0
    plain = tmp_path / "plain.npy"
    run_encode(EncodeOptions(str(changed), str(plain), model=str(tiny_checkpoint), pooling="mean"))
    np.testing.assert_allclose(np.load(out), np.load(plain), rtol=0, atol=1e-6)
    assert not (tmp_path / "out.npy.parts").exists()


@pytest.mark.slow
def test_failing_rank_fails_the_run(tmp_path, tiny_checkpoint, cli_subprocess):
    src = _write(tmp_path / "in.txt", _skewed_lines(150, 2))
    out = tmp_path / "out.npy"
    args = ["encode", src, "-o", out, "--model", tiny_checkpoint, "--chunk-tokens", "100"]
    proc = cli_subprocess(*args, "--workers", "2", env={**ENV, "BERTATTN_TEST_FAIL_CHUNK": "3"})
    assert proc.code != 0
    assert proc.code == 1 and "Traceback" not in proc.err, proc
    last = proc.err.strip().splitlines()[-1]  # one bertattn line names the rank and chunk
    assert last.startswith("bertattn encode: error: --workers 2: rank "), proc
    assert "failed on chunk 3 (lines" in proc.err or "on chunk 3 (lines" in last, proc
    assert "BERTATTN_TEST_FAIL_CHUNK=3" in last
    assert not out.exists()
    manifest = PartsFolder(out).read_manifest()
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
    argv += ["--model", tiny_checkpoint, "--chunk-tokens", "150", "--workers", "2"]
    env = {**ENV, "BERTATTN_TEST_CHUNK_DELAY": "0.4"}
    with cli_subprocess.popen(*argv, env=env, text=True) as proc:  # a session of its own
        deadline = time.monotonic() + 120
        while len(list(parts.glob("chunk-*.npy"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().endswith("bertattn encode: interrupted"), err
    assert not out.exists() and len(list(parts.glob("chunk-*.npy"))) >= 2
