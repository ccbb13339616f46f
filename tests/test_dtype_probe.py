"""``dtype="auto"`` decided by timing (bertattn/encoder/auto_dtype.py, bertattn/runtime/probe.py):
injected timings decide, the tie rule keeps float32, the answer is cached per CPU, torch,
thread count and widths (atomically, one measurement for several processes), and the flag rule
answers when the probe is off or fails. Every test here has a cache folder of its own."""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import bertattn
from bertattn import Bert, choose_dtype
from bertattn.encoder import auto_dtype
from bertattn.errors import UsageError
from bertattn.runtime import probe
from bertattn.runtime.cpu import cpu_name

TODAY = datetime.date.today().isoformat()
AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


@pytest.fixture(autouse=True)
def probing(monkeypatch, tmp_path: Path) -> Path:
    """The probe on, its cache in this test's own folder, this process's answers forgotten
    before and after; returns the cache file's path."""
    monkeypatch.setenv("BERTATTN_DTYPE_PROBE", "1")
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "cache"))
    auto_dtype.reset()
    yield tmp_path / "cache" / probe.CACHE_FILE
    auto_dtype.reset()


def fixed(fp32: float, bf16: float, calls: list[torch.dtype] | None = None) -> Callable:
    """A timer that says ``fp32`` / ``bf16`` seconds a round (and records each call)."""

    def timer(dtype: torch.dtype) -> float:
        if calls is not None:
            calls.append(dtype)
        return {torch.float32: fp32, torch.bfloat16: bf16}[dtype]

    return timer


def must_not_time(dtype: torch.dtype) -> float:
    raise AssertionError(f"timed {dtype} although the answer was cached")


THREADS = torch.get_num_threads()  # the tests' timings are made at the thread count there is


# ---------------------------------------------------------------------- the choice
@pytest.mark.parametrize(
    ("fp32", "bf16", "dtype", "said"),
    [
        (2.0, 1.0, torch.bfloat16, "bf16 2.00x fp32 (timed"),
        (1.0, 4.0, torch.float32, "bf16 0.25x fp32, below the 1.1x bf16 needs (timed"),
        (1.0, 0.95, torch.float32, "bf16 1.05x fp32, below the 1.1x bf16 needs"),  # a tie
        (1.0, 0.89, torch.bfloat16, "bf16 1.12x fp32 (timed"),
    ],
)
def test_injected_timings_decide(fp32: float, bf16: float, dtype: torch.dtype, said: str) -> None:
    calls: list[torch.dtype] = []
    choice = choose_dtype("cpu", threads=THREADS, timer=fixed(fp32, bf16, calls))
    assert choice.dtype == dtype  # never int8, whatever the timings
    assert choice.reason.startswith(said), choice.reason
    assert f"timed {TODAY}, {THREADS} thread" in choice.reason
    assert "384/1536 products at 256 rows" in choice.reason  # MiniLM's widths by default
    assert f"fp32 {fp32 * 1e3:.2f} ms, bf16 {bf16 * 1e3:.2f} ms" in choice.reason
    # both dtypes timed, in turn, at least MIN_ROUNDS rounds each
    assert calls.count(torch.float32) == calls.count(torch.bfloat16) >= auto_dtype.MIN_ROUNDS


def test_the_median_round_decides_not_one_slow_round() -> None:
    """A round disturbed by another process (fp32 timed 10x slower once) does not choose."""
    fp32 = iter([1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0])

    def timer(dtype: torch.dtype) -> float:
        return next(fp32) if dtype == torch.float32 else 1.0

    choice = choose_dtype("cpu", threads=THREADS, timer=timer)
    assert choice.dtype == torch.float32 and choice.reason.startswith("bf16 1.00x fp32")


def test_the_probe_overrules_the_flags(monkeypatch) -> None:
    """An AVX512_BF16 CPU without AMX (the flag rule: float32) where bf16 is timed faster gets
    bf16; an AMX CPU (the flag rule: bfloat16) where it is timed slower gets float32."""
    flags = {"avx2", "avx512f", "avx512_bf16"}
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: flags)
    assert choose_dtype(threads=THREADS, timer=fixed(1.69, 1.0)).dtype == torch.bfloat16
    auto_dtype.reset()
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: set(AMX))
    probe.cache_path().unlink()
    assert choose_dtype(threads=THREADS, timer=fixed(1.0, 2.0)).dtype == torch.float32


# ---------------------------------------------------------------------- the cache
def test_the_answer_is_cached_and_reused(probing: Path) -> None:
    calls: list[torch.dtype] = []
    first = choose_dtype(threads=THREADS, timer=fixed(3.0, 1.0, calls))
    assert calls and probing.exists()
    data = json.loads(probing.read_text())
    (key,) = data["entries"]
    assert key == probe.machine_key(
        "dtype", THREADS, hidden=384, intermediate=1536, rows=auto_dtype.PROBE_ROWS
    )
    assert cpu_name() in key and torch.__version__ in key
    assert data["entries"][key]["dtype"] == "bfloat16" and data["entries"][key]["date"] == TODAY
    # the same process: its own answer; a new process (reset): the file's; neither times
    assert choose_dtype(threads=THREADS, timer=must_not_time) == first
    auto_dtype.reset()
    assert choose_dtype(threads=THREADS, timer=must_not_time) == first
    assert not list(probing.parent.glob("*.tmp"))  # the temporary file was renamed into place


def test_the_cache_is_keyed_by_threads_and_widths(probing: Path) -> None:
    one = choose_dtype(threads=1, timer=fixed(1.0, 2.0))
    two = choose_dtype(threads=2, timer=fixed(2.0, 1.0))  # another count: timed again
    assert (one.dtype, two.dtype) == (torch.float32, torch.bfloat16)
    assert "1 thread;" in one.reason and "2 threads;" in two.reason
    wide = choose_dtype(threads=2, widths=(768, 3072), timer=fixed(1.0, 3.0))
    assert wide.dtype == torch.float32 and "768/3072 products" in wide.reason
    assert len(json.loads(probing.read_text())["entries"]) == 3
    auto_dtype.reset()
    assert choose_dtype(threads=1, timer=must_not_time) == one
    assert choose_dtype(threads=2, timer=must_not_time) == two
    assert torch.get_num_threads() == THREADS  # the count timed at is put back


def test_a_broken_cache_file_is_measured_again_and_replaced(probing: Path, caplog) -> None:
    probing.parent.mkdir(parents=True)
    probing.write_text('{"format": 1, "entries": {"dtype | half a fil')
    with caplog.at_level(logging.WARNING, logger="bertattn"):
        choice = choose_dtype(threads=THREADS, timer=fixed(2.0, 1.0))
    assert choice.dtype == torch.bfloat16
    assert any("is not valid JSON" in r.getMessage() for r in caplog.records)
    assert len(json.loads(probing.read_text())["entries"]) == 1


def test_a_cache_folder_that_cannot_be_written_still_answers(monkeypatch, tmp_path, caplog) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("BERTATTN_CACHE", str(blocker / "cache"))
    with caplog.at_level(logging.INFO, logger="bertattn"):
        choice = choose_dtype(threads=THREADS, timer=fixed(2.0, 1.0))
    assert choice.dtype == torch.bfloat16
    assert any("cannot write the probe cache" in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # three Python processes
def test_processes_started_together_measure_once(tmp_path: Path) -> None:
    """Three processes on an empty cache: one measures (each would time differently), the
    others wait for it and read its answer."""
    log = tmp_path / "measured.txt"
    script = textwrap.dedent(
        f"""
        import os, random, time, torch
        from bertattn import choose_dtype

        def timer(dtype):
            with open({str(log)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(0.05)
            return random.uniform(0.5, 2.0)

        print(choose_dtype(threads=1, timer=timer).reason)
        """
    )
    env = {"BERTATTN_CACHE": str(tmp_path / "cache"), "BERTATTN_DTYPE_PROBE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    reasons = {out.strip() for out, _ in outs}
    assert len(reasons) == 1, reasons
    assert len(set(log.read_text().split())) == 1  # one process timed


# ---------------------------------------------------------------------- off, or failing
def test_off_by_the_environment_the_flags_decide(monkeypatch) -> None:
    monkeypatch.setenv("BERTATTN_DTYPE_PROBE", "0")
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: set(AMX))
    choice = choose_dtype(threads=THREADS, timer=must_not_time)
    assert choice.dtype == torch.bfloat16
    assert choice.reason == auto_dtype.AMX_WHY + " (not timed: BERTATTN_DTYPE_PROBE=0)"
    assert not probe.cache_path().exists()
    # injected flags ask for the rule on those flags; probe=False asks for the rule here
    monkeypatch.setenv("BERTATTN_DTYPE_PROBE", "1")
    assert choose_dtype(cpu_flags={"avx2"}, timer=must_not_time).reason == auto_dtype.EMULATED_WHY
    assert choose_dtype(probe=False, timer=must_not_time).reason == auto_dtype.AMX_WHY


@pytest.mark.parametrize("value", ["of", "2", "disable"])
def test_a_misspelt_switch_is_refused(monkeypatch, value: str) -> None:
    monkeypatch.setenv("BERTATTN_DTYPE_PROBE", value)
    with pytest.raises(UsageError, match=rf"BERTATTN_DTYPE_PROBE='{value}' is not one of 1/0"):
        choose_dtype()
    with pytest.raises(ValueError, match="set BERTATTN_DTYPE_PROBE=0 to choose the dtype"):
        choose_dtype()


def test_a_failing_probe_falls_back_to_the_flags(monkeypatch, caplog) -> None:
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: {"avx2"})

    def broken(dtype: torch.dtype) -> float:
        raise RuntimeError("no bf16 kernel in this build")

    with caplog.at_level(logging.WARNING, logger="bertattn"):
        choice = choose_dtype(threads=THREADS, timer=broken)
    assert choice.dtype == torch.float32
    assert choice.reason == (
        auto_dtype.EMULATED_WHY
        + " (not timed: the probe failed: RuntimeError: no bf16 kernel in this build)"
    )
    assert any("the dtype probe failed" in r.getMessage() for r in caplog.records)
    assert not probe.cache_path().exists()  # nothing cached: the next process tries again


def test_cuda_is_not_timed() -> None:
    choice = choose_dtype("cuda", cuda_bf16=True, timer=must_not_time)
    assert choice.dtype == torch.bfloat16 and "CUDA" in choice.reason


# ---------------------------------------------------------------------- on this machine
def test_the_real_probe_is_short_and_consistent(probing: Path) -> None:
    import time

    start = time.perf_counter()
    choice = choose_dtype(threads=1)
    took = time.perf_counter() - start
    assert took < 30, took  # a few hundred ms on a quiet CPU; bounded by rounds and budget
    if not probing.exists():  # this machine was busy: said, and nothing kept
        assert "not timed: the dtype probe waited" in choice.reason, choice
        assert choice == auto_dtype.flag_rule() or choice.reason.startswith(
            auto_dtype.flag_rule().reason
        )
        return
    entry = next(iter(json.loads(probing.read_text())["entries"].values()))
    assert entry["fp32_ms"] > 0 and entry["bf16_ms"] > 0
    want = torch.bfloat16 if entry["ratio"] >= auto_dtype.MARGIN else torch.float32
    assert choice.dtype == want, choice
    assert choice.reason.startswith(f"bf16 {entry['ratio']:.2f}x fp32")


# ---------------------------------------------------------------------- a busy CPU, a bad file
class Waits:
    """A run-queue delay reader (``auto_dtype.RunDelay``) whose threads wait ``step_s`` more
    seconds at each reading: 0 is a quiet CPU, 10 one held by other processes."""

    def __init__(self, step_s: float) -> None:
        self.step_ns, self.waited = int(step_s * 1e9), 0

    def __call__(self) -> Waits:
        return self

    def total(self) -> int:
        self.waited += self.step_ns
        return self.waited


def test_a_timing_on_a_busy_cpu_is_not_kept(monkeypatch, probing: Path, caplog) -> None:
    monkeypatch.setattr(auto_dtype, "RunDelay", Waits(10.0))
    with caplog.at_level(logging.INFO, logger="bertattn"):
        choice = choose_dtype("cpu", threads=THREADS, timer=fixed(2.0, 1.0))
    rule = auto_dtype.flag_rule()
    assert choice.dtype == rule.dtype  # the CPU's flags, not the busy timing's bf16
    assert choice.reason.startswith(rule.reason + " (not timed: the dtype probe waited ")
    assert "not cached" in choice.reason and "--remeasure" in choice.reason
    assert not probing.exists()  # nothing kept: a later, quiet process times it
    said = [r.getMessage() for r in caplog.records]
    assert any("for a CPU" in m and "the CPU's flags decide in this process" in m for m in said)
    # this process does not time again; a new one (reset) on a quiet CPU times and keeps it
    assert choose_dtype("cpu", threads=THREADS, timer=must_not_time) == choice
    auto_dtype.reset()
    monkeypatch.setattr(auto_dtype, "RunDelay", Waits(0))
    assert choose_dtype("cpu", threads=THREADS, timer=fixed(2.0, 1.0)).dtype == torch.bfloat16
    assert len(json.loads(probing.read_text())["entries"]) == 1


def test_a_little_waiting_is_kept(monkeypatch, probing: Path) -> None:
    """The share is the wait over the timing's threads x wall time: a few us of waiting in
    seconds of timing is a quiet CPU."""
    monkeypatch.setattr(auto_dtype, "RunDelay", Waits(1e-6))
    slow = fixed(0.2, 0.1)  # (7 rounds x 0.3 s of wall time are not spent: the timer says it)

    def timer(dtype: torch.dtype) -> float:
        import time

        time.sleep(0.01)
        return slow(dtype)

    assert choose_dtype("cpu", threads=THREADS, timer=timer).dtype == torch.bfloat16
    assert probing.exists()


def test_a_non_utf8_cache_file_is_measured_again_and_replaced(probing: Path, caplog) -> None:
    probing.parent.mkdir(parents=True)
    probing.write_bytes(b'{"format": 1, "entries": {"\xff\xfe": {}}}')
    with caplog.at_level(logging.WARNING, logger="bertattn"):
        choice = choose_dtype(threads=THREADS, timer=fixed(2.0, 1.0))
    assert choice.dtype == torch.bfloat16 and choice.reason.startswith("bf16 2.00x fp32 (timed")
    assert any("not UTF-8" in r.getMessage() for r in caplog.records)
    assert len(json.loads(probing.read_text(encoding="utf-8"))["entries"]) == 1


def in_a_thread(fn: Callable[[], object], timeout: float = 20) -> object:
    """``fn()`` in a daemon thread; fails when it has not returned within ``timeout`` s (a read
    that blocks or does not end), instead of hanging the suite."""
    import threading

    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(fn()), daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), f"still reading the probe cache after {timeout} s"
    return done[0]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "huge"])
def test_what_is_no_cache_file_is_never_read_without_bound(kind, probing: Path, caplog) -> None:
    probing.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(probing)  # an open for reading waits for a writer
        said = "is not a regular file"
    elif kind == "/dev/zero":
        probing.symlink_to("/dev/zero")  # reads never end
        said = "is not a regular file"
    else:
        probing.write_bytes(b" " * (probe.MAX_BYTES + 1) + b"{}")
        said = f"over the {probe.MAX_BYTES}"
    with caplog.at_level(logging.WARNING, logger="bertattn"):
        choice = in_a_thread(lambda: choose_dtype(threads=THREADS, timer=fixed(2.0, 1.0)))
    assert choice.dtype == torch.bfloat16  # type: ignore[attr-defined]
    assert any(said in r.getMessage() for r in caplog.records), caplog.text
    assert probing.is_file() and not probing.is_symlink()  # replaced by a cache file
    assert len(json.loads(probing.read_text(encoding="utf-8"))["entries"]) == 1


def test_forget_removes_the_file_so_the_next_choice_times_again(probing: Path) -> None:
    choose_dtype(threads=THREADS, timer=fixed(2.0, 1.0))
    assert probe.forget() is True and not probing.exists()
    assert probe.forget() is False
    auto_dtype.reset()
    assert choose_dtype(threads=THREADS, timer=fixed(1.0, 2.0)).dtype == torch.float32


def test_bench_dispatch_prints_the_cache_files_and_remeasures(probing: Path, cli) -> None:
    from bertattn.attention import gemm

    r = cli("bench", "--dispatch")
    assert r.code == 0, r
    assert f"dtype probe (--dtype auto) kept in: {probing}" in r.out
    assert f"product libraries kept in: {gemm.cache_path()}" in r.out
    assert "bertattn bench --dispatch --remeasure" in r.out
    probing.write_text('{"format": 1, "entries": {}}')  # stands for an old, busy timing
    r = cli("bench", "--dispatch", "--remeasure")
    assert r.code == 0, r
    assert f"forgot {probing}" in r.out
    if probing.exists():  # timed again now (a busy machine keeps nothing: said in the line)
        assert json.loads(probing.read_text())["entries"], probing.read_text()
    else:
        assert "not timed: the dtype probe waited" in r.out
    r = cli("bench", "--remeasure")
    assert r.code == 2 and "--remeasure goes with --dispatch" in r.err, r


# ---------------------------------------------------------------------- where the reason goes
@pytest.fixture
def bf16_faster(monkeypatch) -> list[tuple[int, int, int]]:
    """The products timed as if bf16 were twice as fast; records the shapes asked for."""
    asked: list[tuple[int, int, int]] = []

    def timer_for(hidden: int, inter: int, rows: int) -> Callable:
        asked.append((hidden, inter, rows))
        return fixed(2.0e-3, 1.0e-3)

    monkeypatch.setattr(auto_dtype, "_product_timer", timer_for)
    monkeypatch.setattr(auto_dtype, "RunDelay", Waits(0))  # a quiet CPU, whatever this one does
    return asked


def test_bert_load_times_the_models_own_widths(bf16_faster, tiny_checkpoint: Path, caplog) -> None:
    import warnings

    with caplog.at_level(logging.INFO, logger="bertattn"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without it: the slow-half warning
        bert = Bert.load(tiny_checkpoint, dtype="auto", threads=1)
    assert bf16_faster == [(32, 37, auto_dtype.PROBE_ROWS)]  # tiny_bert.TINY's widths
    assert bert.dtype == torch.bfloat16
    reason = bert.dtype_reason
    assert reason is not None and reason.startswith("bf16 2.00x fp32 (timed ")
    assert f"{TODAY}, 1 thread; 32/37 products" in reason
    lines = [r.getMessage() for r in caplog.records]
    assert f"dtype auto on cpu: bfloat16 ({reason})" in lines, lines
    with bertattn.explain() as log:
        bert.encode(["one text"])
    assert f"encode: dtype auto: bfloat16 ({reason})" in log.notes


def test_the_reason_reaches_info_and_bench(bf16_faster, tiny_checkpoint: Path, cli) -> None:
    import warnings

    from starlette.testclient import TestClient

    from bertattn.bench import environment
    from bertattn.serve import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bert = Bert.load(tiny_checkpoint, dtype="auto", threads=1)
    with TestClient(create_app(bert)) as client:
        info = client.get("/info").json()
    assert info["dtype"] == "bfloat16" and info["dtype_reason"] == bert.dtype_reason
    assert "bf16 2.00x fp32" in info["dtype_reason"]
    env = environment()
    assert env["auto_dtype"] == "bfloat16" and env["auto_dtype_reason"].startswith("bf16 2.00x")
    r = cli("bench", "--dispatch")
    assert r.code == 0, r
    line = next(x for x in r.out.splitlines() if x.startswith("cpu: "))
    assert "--dtype auto: bfloat16 (bf16 2.00x fp32 (timed" in line, line
