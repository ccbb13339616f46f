"""The library under abuse (items of the issue "Promises under abuse"): a copied or pickled
``Bert``, ``Embeddings`` indexed as NumPy indexes, bounded thread counts, lone surrogates,
and huge texts cut before tokenizing without changing the result."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from bertattn import Bert
from bertattn.threads import ADAPTIVE_ENV, CpuBudget, ThreadChoice, choose_threads


# ---------------------------------------------------------------------- copy and pickle
@pytest.fixture
def governed_bert(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Bert:
    """A tiny Bert loaded as where ``OMP_NUM_THREADS`` is unset: with its thread governor
    (whose lock did not pickle)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv(ADAPTIVE_ENV, "1")
    bert = Bert.load(tiny_checkpoint)
    assert bert.governor is not None  # the failing case: a governor with a lock
    return bert


TEXTS = ["hello world", "a second, longer text about attention"]


def test_deepcopy_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = copy.deepcopy(governed_bert)
    assert twin.governor is not governed_bert.governor
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))


def test_pickle_roundtrip_of_a_governed_bert_encodes_the_same(governed_bert: Bert) -> None:
    twin = pickle.loads(pickle.dumps(governed_bert))
    assert twin.governor is not None
    np.testing.assert_array_equal(twin.encode(TEXTS), governed_bert.encode(TEXTS))
    # the copy's governor still governs: its lock works
    with twin.governor.batch(10) as n:
        assert n >= 1


def _encode_in_worker(blob: bytes) -> np.ndarray:
    return pickle.loads(blob).encode(TEXTS)


@pytest.mark.slow
def test_a_spawned_worker_encodes_with_a_pickled_bert(governed_bert: Bert) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        rows = pool.apply(_encode_in_worker, (pickle.dumps(governed_bert),))
    np.testing.assert_allclose(rows, governed_bert.encode(TEXTS), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------- thread counts
def _choose(environ: dict[str, str], threads: int | None = None) -> ThreadChoice:
    return choose_threads(threads, environ=environ, budget=CpuBudget(2), current=2)


@pytest.mark.parametrize("threads", [10**9, 100_000])
def test_an_explicit_thread_count_beyond_the_cap_is_refused(threads: int) -> None:
    with pytest.raises(ValueError, match=rf"threads {threads} is more threads than bertattn runs"):
        _choose({}, threads)


def test_the_cap_is_8_per_cpu_and_at_least_64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _choose({}, 64).threads == 64
    with pytest.raises(ValueError, match=r"at most 64 \(8 per CPU of this machine's 2"):
        _choose({}, 65)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert _choose({}, 128).threads == 128
    with pytest.raises(ValueError, match="at most 128"):
        _choose({}, 129)


def test_bert_load_refuses_a_billion_threads_before_reading(tmp_path: Path) -> None:
    # the folder does not exist: the thread count is refused before anything is read
    with pytest.raises(ValueError, match="more threads than bertattn runs"):
        Bert.load(tmp_path / "missing", threads=10**9)


def test_omp_num_threads_beyond_the_cap_is_clamped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.warns(UserWarning, match="OMP_NUM_THREADS=999 is more threads .* using 64"):
        choice = _choose({"OMP_NUM_THREADS": "999"})
    assert choice.threads == 64 and not choice.adaptive
    assert _choose({"OMP_NUM_THREADS": "3"}).threads == 3  # within the cap: as given


@pytest.mark.parametrize(
    ("value", "adaptive"),
    [("1", True), ("TRUE", True), ("On", True), ("yes", True), ("", True), (" 0 ", False)]
    + [("False", False), ("OFF", False), ("no", False)],
)
def test_adaptive_threads_accepts_the_documented_values(value: str, adaptive: bool) -> None:
    assert _choose({ADAPTIVE_ENV: value}).adaptive is adaptive


@pytest.mark.parametrize("value", ["garbage", "2", "nope", "offf"])
def test_adaptive_threads_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{ADAPTIVE_ENV}='{value}' is not one of 1/0"):
        _choose({ADAPTIVE_ENV: value})


@pytest.mark.parametrize("command", ["serve", "encode"])
def test_cli_threads_beyond_the_cap_is_one_line_exit_2(cli, tmp_path: Path, command: str) -> None:
    argv = ["--model", tmp_path / "never-read", "--threads", "100000"]
    if command == "encode":
        argv = [tmp_path / "in.txt", "-o", tmp_path / "out.npy", *argv]
        (tmp_path / "in.txt").write_text("hello\n")
    r = cli(command, *argv)
    assert r.code == 2, r
    assert "--threads 100000 is more threads than bertattn runs" in r.err, r
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r


def test_cli_adaptive_threads_garbage_is_one_line_exit_2(cli, tiny_checkpoint: Path, tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    r = cli(
        "encode",
        tmp_path / "in.txt",
        "-o",
        tmp_path / "out.npy",
        "--model",
        tiny_checkpoint,
        env={ADAPTIVE_ENV: "garbage"},
    )
    assert r.code == 2, r
    assert f"{ADAPTIVE_ENV}='garbage' is not one of" in r.err and "Traceback" not in r.err, r
