"""Every command that writes to stdout, run with stdout on a full disk (``> /dev/full``: every
write fails with ENOSPC): one line, ``bertattn COMMAND: error: <stdout>: No space left on
device``, exit 1, no traceback and no "Exception ignored" from the interpreter's exit."""

from __future__ import annotations

import os

import pytest

pytestmark = [
    pytest.mark.slow,  # real processes
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full"),
]


def _stdout_on_dev_full() -> None:
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, 1)
    os.close(full)


def _fails_naming_stdout(r, command: str) -> None:  # type: ignore[no-untyped-def]
    assert r.code == 1, r
    assert "Traceback" not in r.err and "Exception ignored" not in r.err, r.err
    lines = r.err.strip().splitlines()  # bench --json -: the table, on stderr, comes first
    assert lines[-1] == f"bertattn {command}: error: <stdout>: No space left on device", r.err
    assert sum("error" in line for line in lines) == 1, r.err


@pytest.mark.parametrize(
    "argv",
    [
        ["a text"],  # the summary
        ["a text", "--rollout"],
        ["a text", "--json", "-"],
        ["a text", "--html", "-"],
        ["a text", "--explain", "0:0:a"],
    ],
    ids=["summary", "rollout", "json", "html", "explain"],
)
def test_attend(argv, cli_subprocess, tiny_checkpoint):
    r = cli_subprocess("attend", *argv, "--model", tiny_checkpoint, preexec_fn=_stdout_on_dev_full)
    _fails_naming_stdout(r, "attend")


def test_encode_to_stdout(tmp_path, cli_subprocess, tiny_checkpoint):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    r = cli_subprocess(
        "encode", tmp_path / "in.txt", "-o", "-", "--model", tiny_checkpoint, "-q",
        preexec_fn=_stdout_on_dev_full,
    )  # fmt: skip
    _fails_naming_stdout(r, "encode")


@pytest.mark.parametrize(
    "argv",
    [["--dispatch"], ["--dispatch", "--json", "-"], ["--cases", "1", "--repeats", "1"]],
    ids=["dispatch-table", "dispatch-json", "module-table"],
)
def test_bench(argv, cli_subprocess):
    r = cli_subprocess("bench", *argv, preexec_fn=_stdout_on_dev_full)
    _fails_naming_stdout(r, "bench")


def test_demo(cli_subprocess):
    r = cli_subprocess("demo", preexec_fn=_stdout_on_dev_full)
    _fails_naming_stdout(r, "demo")
