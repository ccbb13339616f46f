"""Distributed, resumable `bertattn encode`: chunk planning and balance (in process), then real
multi-process runs (torchrun / --workers on gloo, CPU) as subprocesses: equality with one
process, crash and resume, refused manifests, a failing rank."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
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

SRC = Path(__file__).resolve().parents[1] / "src"
WORDS = "the attention head looks at every token in the sentence and weighs it".split()
LONG = " ".join(["supercalifragilistic expialidocious"] * 100)  # over 256 tokens: truncated


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTATTN_TEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def _encode(*args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bertattn", "encode", *args],
        capture_output=True,
        text=True,
        env=_env(**extra),
        timeout=300,
    )


def _torchrun(nprocs: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nprocs}", "-m", "bertattn", "encode", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)


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


def _save_tiny(folder: Path, minilm_dir: Path, seed: int) -> Path:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=30522,  # MiniLM's tokenizer, copied in below
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    transformers.BertModel(config).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, minilm_dir) -> Path:
    return _save_tiny(tmp_path_factory.mktemp("tiny"), minilm_dir, seed=0)


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
def test_two_ranks_equal_one_rank_and_balanced(tmp_path, minilm_dir):
    """torchrun, 2 ranks on gloo, MiniLM, a skewed file (long truncated lines + short ones
    + an empty one): same rows, same order as one process, ≤ 1e-6; tokens balanced."""
    lines = _skewed_lines(200, 6)
    src = _write(tmp_path / "in.txt", lines)
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    proc = _encode(str(src), "-o", str(one), "-q", "--model", str(minilm_dir))
    assert proc.returncode == 0, proc.stderr
    proc = _torchrun(
        2, str(src), "-o", str(two), "--model", str(minilm_dir), "--chunk-tokens", "256"
    )
    assert proc.returncode == 0, proc.stderr
    a, b = np.load(one), np.load(two)
    assert a.shape == b.shape == (len(lines), 384)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert np.abs(b[3]).max() > 0  # the empty line's row is there, at its place
    assert not (tmp_path / "two.npy.parts").exists()
    assert "2 rank(s)" in proc.stderr and "padding" in proc.stderr and "sentences/s" in proc.stderr
    assert f"{len(lines)} lines (1 empty, 6 truncated to 256 tokens)" in proc.stderr
    tokens = _rank_tokens(proc.stderr)
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
def test_killed_rank_then_resume(tmp_path, tiny):
    """SIGKILL rank 1 once some parts exist: the run fails (no output, parts kept); the rerun
    finishes, reuses exactly the parts that existed, and equals an uninterrupted run."""
    src = _write(tmp_path / "in.txt", _skewed_lines(300, 4))
    common = ["--model", str(tiny), "--chunk-tokens", "150", "-q"]
    ref = tmp_path / "ref.npy"  # uninterrupted, one process: the same chunks, the same bytes
    proc = _encode(str(src), "-o", str(ref), *common, "--resumable")
    assert proc.returncode == 0, proc.stderr
    computed, reused = _summary(proc.stderr)
    assert reused == 0 and computed > 12

    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    two = ["--workers", "2"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "bertattn", "encode", str(src), "-o", str(out), *common, *two],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(BERTATTN_TEST_CHUNK_DELAY="0.4"),
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(parts.glob("chunk-*.npy"))) < 3:
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
            time.sleep(0.05)
        victims = _descendants_with_rank(launcher.pid, "1")
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        err = launcher.communicate(timeout=120)[1]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0, err
    assert re.search(r"stopped \(SystemExit\): \d+ chunk\(s\) not written: \d", err), err
    assert not out.exists()
    done = len(list(parts.glob("chunk-*.npy")))
    assert 3 <= done < computed

    proc = _encode(str(src), "-o", str(out), *common, *two)
    assert proc.returncode == 0, proc.stderr
    assert f"({done} done before)" in proc.stderr
    assert _summary(proc.stderr) == (computed - done, done)
    np.testing.assert_array_equal(np.load(out), np.load(ref))
    assert not parts.exists()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_changed_input_model_or_settings_refused_then_restart(
    tmp_path, tiny, minilm_dir, monkeypatch
):
    src = _write(tmp_path / "in.txt", _skewed_lines(120, 2))
    out = tmp_path / "out.npy"
    kw = dict(model=str(tiny), chunk_tokens=200, resumable=True)  # one process, in process

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

    base = [str(src), "-o", str(out), "--model", str(tiny), "--chunk-tokens", "200", "-q"]
    proc = _encode(*base, "--resumable", "--pooling", "mean")  # a plain HF folder: cls
    assert proc.returncode == 2, proc.stderr
    assert "the settings changed since the interrupted run (pooling 'cls' -> 'mean')" in (
        proc.stderr
    )
    assert "pass --restart to discard the finished chunks in" in proc.stderr

    other = _save_tiny(tmp_path / "tiny2", minilm_dir, seed=1)
    with pytest.raises(UsageError, match=r"the model changed since the interrupted run \(files"):
        chunked(model=str(other))
    changed = _write(tmp_path / "in.txt", _skewed_lines(120, 2) + ["one more line"])
    with pytest.raises(UsageError, match=r"the input file changed .* \(sha256 .* --restart"):
        chunked()
    assert not out.exists()

    proc = _encode(*base, "--pooling", "mean", "--restart")  # --restart implies --resumable
    assert proc.returncode == 0, proc.stderr
    assert _summary(proc.stderr)[1] == 0
    plain = tmp_path / "plain.npy"
    run_encode(EncodeOptions(str(changed), str(plain), model=str(tiny), pooling="mean"))
    np.testing.assert_allclose(np.load(out), np.load(plain), rtol=0, atol=1e-6)
    assert not (tmp_path / "out.npy.parts").exists()


@pytest.mark.slow
def test_failing_rank_fails_the_run(tmp_path, tiny):
    src = _write(tmp_path / "in.txt", _skewed_lines(150, 2))
    out = tmp_path / "out.npy"
    args = [str(src), "-o", str(out), "--model", str(tiny), "--chunk-tokens", "100", "-q"]
    proc = _encode(*args, "--workers", "2", BERTATTN_TEST_FAIL_CHUNK="3")
    assert proc.returncode != 0
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # one bertattn line names the rank and chunk
    assert last.startswith("bertattn encode: error: --workers 2: rank "), proc.stderr
    assert "failed on chunk 3 (lines" in proc.stderr or "on chunk 3 (lines" in last, proc.stderr
    assert "BERTATTN_TEST_FAIL_CHUNK=3" in last
    assert not out.exists()
    manifest = PartsFolder(out).read_manifest()
    assert manifest is not None and len(manifest["chunks"]) > 3
    proc = _encode(*args, "--workers", "2")  # the rerun completes what is missing
    assert proc.returncode == 0, proc.stderr
    assert np.load(out).shape == (152, 32)


@pytest.mark.slow
def test_ctrl_c_during_workers_exits_130(tmp_path, tiny):
    """SIGINT to the whole process group (a terminal's Ctrl-C) while two ranks work: 130, no
    traceback, no output, the finished chunks kept for a rerun."""
    src = _write(tmp_path / "in.txt", _skewed_lines(300, 2))
    out = tmp_path / "out.npy"
    parts = tmp_path / "out.npy.parts"
    cmd = [sys.executable, "-m", "bertattn", "encode", str(src), "-o", str(out), "-q"]
    cmd += ["--model", str(tiny), "--chunk-tokens", "150", "--workers", "2"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(BERTATTN_TEST_CHUNK_DELAY="0.4"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(parts.glob("chunk-*.npy"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().endswith("bertattn encode: interrupted"), err
    assert not out.exists() and len(list(parts.glob("chunk-*.npy"))) >= 2
