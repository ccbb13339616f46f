"""`bertattn bench` options: each refused before any work with exit 2 and one line (no
traceback), `--json` checked up front and written atomically, `--json -` on stdout with the
table on stderr, and the `wrote` status line on stderr.

Most tests use `--dispatch` (a table, no timing) or replace the module benchmark with a fake
that records its calls, so they are fast and can tell whether the work started."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

DISPATCH = pytest.mark.parametrize("mode", [(), ("--dispatch",)], ids=["module", "dispatch"])


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """`--threads` sets torch's threads for the whole (test) process: put them back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def bench_calls(monkeypatch) -> list[tuple[list, int]]:
    """The module benchmark replaced by a fake that records ``(cases, repeats)`` and returns no
    results: what `bench` (without `--dispatch`) would have timed, instantly."""
    import bertattn.bench.module as module

    calls: list[tuple[list, int]] = []

    def fake(cases=None, *, repeats=5, progress=None):
        calls.append((list(cases or []), repeats))
        return []

    monkeypatch.setattr(module, "run_module_bench", fake)
    return calls


def _one_line_usage_error(r, message: str) -> None:
    assert r.code == 2, r
    assert "Traceback" not in r.err, r
    assert r.err.strip() == f"bertattn bench: error: {message}", r
    assert r.out == "", r  # refused before any work: no header, no table


# ---------------------------------------------------------------------- 1. --threads
@DISPATCH
def test_threads_negative_is_a_usage_error(cli, bench_calls, mode) -> None:
    r = cli("bench", *mode, "--threads", "-2")
    _one_line_usage_error(
        r, "--threads must be an integer >= 1 (or 0 for torch's default), got -2."
    )
    assert bench_calls == []


def test_threads_above_the_usable_cpus_warns_on_stderr(cli_subprocess, tmp_path) -> None:
    from bertattn.runtime.threads import cpu_budget

    budget = cpu_budget()
    n = budget.cpus + 1
    r = cli_subprocess("bench", "--dispatch", "--threads", n, cwd=tmp_path, timeout=120)
    assert r.code == 0, r
    assert "Traceback" not in r.err, r
    assert f"--threads {n}: this process may use {budget.describe()}" in r.err, r
    assert "oversubscribed" in r.err, r
    assert "attention dispatch policy" in r.out  # the work still ran


# ---------------------------------------------------------------------- 2. --repeats
@DISPATCH
@pytest.mark.parametrize("repeats", ["0", "-1"])
def test_repeats_below_one_is_refused_before_any_work(cli, bench_calls, mode, repeats) -> None:
    r = cli("bench", *mode, "--repeats", repeats)
    _one_line_usage_error(r, f"--repeats must be an integer >= 1, got {repeats}.")
    assert bench_calls == []


def test_repeats_below_one_with_measure(cli) -> None:
    r = cli("bench", "--dispatch", "--measure", "--repeats", "0")
    _one_line_usage_error(r, "--repeats must be an integer >= 1, got 0.")


# ---------------------------------------------------------------------- 3. --cases
@DISPATCH
@pytest.mark.parametrize("cases", ["0", "-1"])
def test_cases_below_one_is_refused(cli, bench_calls, mode, cases) -> None:
    from bertattn.bench.module import DEFAULT_CASES

    r = cli("bench", *mode, "--cases", cases)
    _one_line_usage_error(
        r,
        f"--cases must be an integer >= 1, got {cases} (there are {len(DEFAULT_CASES)} cases; "
        f"drop --cases to run them all).",
    )
    assert bench_calls == []  # neither all the cases (0) nor all but the last (-1)


def test_cases_selects_the_first_n_and_more_than_there_are_runs_all(cli, bench_calls) -> None:
    from bertattn.bench.module import DEFAULT_CASES

    assert cli("bench", "--cases", "1", "--repeats", "2").code == 0
    assert cli("bench", "--cases", str(len(DEFAULT_CASES) + 5)).code == 0
    assert cli("bench").code == 0
    assert bench_calls == [
        (DEFAULT_CASES[:1], 2),
        (list(DEFAULT_CASES), 5),
        (list(DEFAULT_CASES), 5),
    ]


# ---------------------------------------------------------------------- 4. --json checked first
def _unwritable(tmp_path: Path) -> str:
    """A 0555 folder for a normal user; for root, who may write in any folder of a normal
    filesystem, sysfs (which refuses new files even to root)."""
    if os.geteuid() == 0:
        return "/sys/out.json"
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return str(folder / "out.json")


@DISPATCH
@pytest.mark.parametrize("case", ["missing folder", "a folder", "unwritable folder"])
def test_json_output_is_checked_before_the_work(
    cli, bench_calls, monkeypatch, tmp_path, mode, case
) -> None:
    monkeypatch.chdir(tmp_path)
    if case == "missing folder":
        path, message = (
            "nope/out.json",
            (
                "--json nope/out.json: the folder nope does not exist; create it first "
                "(mkdir -p nope)."
            ),
        )
    elif case == "a folder":
        (tmp_path / "results").mkdir()
        path, message = "results", "--json results is a folder; give a file name inside it."
    else:
        path = _unwritable(tmp_path)
        message = f"--json {path}: cannot write in the folder {Path(path).parent} ("
    before = sorted(os.listdir(tmp_path))
    try:
        r = cli("bench", *mode, "--json", path)
    finally:
        if (tmp_path / "locked").exists():
            (tmp_path / "locked").chmod(0o755)
    assert r.code == 2, r
    assert "Traceback" not in r.err, r
    assert r.err.startswith(f"bertattn bench: error: {message}"), r
    assert len(r.err.strip().splitlines()) == 1, r
    assert r.out == "", r  # no header, no table: nothing was computed
    assert bench_calls == []
    assert sorted(os.listdir(tmp_path)) == before  # no output, no temporary file
    assert not (tmp_path / "-").exists()


# ---------------------------------------------------------------------- 5. --json -
def _json_to_stdout_checks(r, tmp_path: Path) -> dict:
    assert r.code == 0, r
    assert "Traceback" not in r.err, r
    data = json.loads(r.out)  # stdout is the JSON and nothing else
    assert "wrote" not in r.err
    assert not (tmp_path / "-").exists()
    assert os.listdir(tmp_path) == []  # no file, no temporary file
    return data


def test_json_dash_dispatch_writes_stdout_and_the_table_to_stderr(
    cli, monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _json_to_stdout_checks(cli("bench", "--dispatch", "--json", "-"), tmp_path)
    assert set(data) == {"environment", "caches", "table"} and data["table"]
    assert data["caches"]["dtype probe (--dtype auto)"].endswith("probes.json")


def test_json_dash_module_writes_stdout_and_the_table_to_stderr(
    cli, bench_calls, monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("bench", "--cases", "1", "--repeats", "1", "--json", "-")
    data = _json_to_stdout_checks(r, tmp_path)
    assert data["module"] == [] and "environment" in data
    assert "module benchmark:" in r.err and "median ms" in r.err  # header and table
    assert len(bench_calls) == 1


def test_json_dash_real_benchmark_one_case(cli, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("bench", "--cases", "1", "--repeats", "1", "--json", "-")
    data = _json_to_stdout_checks(r, tmp_path)
    assert len(data["module"]) == 1 and "bertattn" in data["module"][0]["seconds"]
    assert "bertattn" in r.err and "median ms" in r.err


# ---------------------------------------------------------------------- 6. "wrote" on stderr
@DISPATCH
def test_wrote_line_goes_to_stderr_and_the_file_is_written_atomically(
    cli, bench_calls, monkeypatch, tmp_path, mode
) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("bench", *mode, "--json", "out.json")
    assert r.code == 0, r
    assert "Traceback" not in r.err, r
    assert "wrote" not in r.out, r
    assert f"bertattn bench: wrote {(tmp_path / 'out.json').resolve()}" in r.err, r
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left
    data = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert "environment" in data and ("table" in data if mode else "module" in data)
    assert r.out.strip()  # the human-readable output still on stdout


def test_interleaved_rounds_vary_which_peer_comes_before_which() -> None:
    """No peer always runs right after the same other one (whose spinning threads or slowed
    CPU would then always land on it); the orders repeat from run to run."""
    from bertattn.bench import interleaved_medians

    def orders() -> list[list[str]]:
        calls: list[str] = []
        fns = {name: (lambda name=name: calls.append(name)) for name in "abcdef"}
        timer = interleaved_medians(fns, repeats=6, warmup=0)
        assert all(len(samples) == 6 for samples in timer.samples.values())
        return [calls[i : i + 6] for i in range(0, 36, 6)]

    rounds = orders()
    assert rounds[0] == list("abcdef") and all(sorted(r) == list("abcdef") for r in rounds)
    before_a = {r[r.index("a") - 1] for r in rounds if r.index("a") > 0}
    assert len(before_a) >= 2, rounds
    assert orders() == rounds
    assert interleaved_medians({}, repeats=2).samples == {}
