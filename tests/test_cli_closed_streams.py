"""A command started with a standard stream closed (``<&-``, ``>&-``, ``2>&-``: the descriptor
really closed in the child, which ``stdin=subprocess.DEVNULL`` is not): one error line and exit
2 when the run needs that stream, never an AttributeError traceback; and with stderr closed,
errors are dropped rather than written into the data on stdout."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow  # real processes


def _closing(fd: int):  # type: ignore[no-untyped-def]
    return lambda: os.close(fd)


def _refused(r, message: str) -> None:  # type: ignore[no-untyped-def]
    assert r.code == 2, r
    assert "Traceback" not in r.err and "AttributeError" not in r.err, r.err
    errors = [line for line in r.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], r.err


def test_encode_stdin_closed(tmp_path, cli_subprocess, tiny_checkpoint):
    r = cli_subprocess(
        "encode", "-", "-o", tmp_path / "o.npy", "--model", tiny_checkpoint,
        preexec_fn=_closing(0),
    )  # fmt: skip
    _refused(r, "input - reads stdin, which is closed (the command was started with <&-)")
    assert not (tmp_path / "o.npy").exists()


def test_attend_stdin_closed(cli_subprocess, tiny_checkpoint):
    r = cli_subprocess("attend", "-", "--model", tiny_checkpoint, preexec_fn=_closing(0))
    _refused(r, "attend - reads stdin, which is closed")


def test_attend_stdout_closed(tmp_path, cli_subprocess, tiny_checkpoint):
    r = cli_subprocess("attend", "a text", "--model", tiny_checkpoint, preexec_fn=_closing(1))
    _refused(r, "stdout is closed (the command was started with >&-), and attend writes")
    r = cli_subprocess(  # files only: stdout is not needed
        "attend", "a text", "--model", tiny_checkpoint, "--html", tmp_path / "a.html",
        preexec_fn=_closing(1),
    )  # fmt: skip
    assert r.code == 0 and (tmp_path / "a.html").is_file(), r


def test_encode_stdout_closed(tmp_path, cli_subprocess, tiny_checkpoint):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    model = ["--model", tiny_checkpoint]
    r = cli_subprocess("encode", tmp_path / "in.txt", "-o", "-", *model, preexec_fn=_closing(1))
    _refused(r, "--output - writes to stdout, which is closed")
    r = cli_subprocess(
        "encode", tmp_path / "in.txt", "-o", tmp_path / "o.npy", *model, preexec_fn=_closing(1)
    )
    assert r.code == 0 and (tmp_path / "o.npy").is_file(), r


def test_stderr_closed_keeps_errors_out_of_stdout(tmp_path, cli_subprocess, tiny_checkpoint):
    r = cli_subprocess(
        "encode", tmp_path / "missing.txt", "-o", "-", "--model", tiny_checkpoint,
        preexec_fn=_closing(2),
    )  # fmt: skip
    assert r.code == 2 and r.out == "", r
