"""``bertattn demo``: the article's example, as a user runs it; and the two command runners of
conftest.py (``cli`` in process, ``cli_subprocess`` a real process) on the tiny checkpoint."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

import bertattn
from bertattn import Bert


def test_demo_prints_shapes_and_every_backend(cli) -> None:
    r = cli("demo")
    assert r.code == 0, r
    out = r.out
    assert re.search(r"input shape:\s+\(2, 10, 512\)", out)
    assert re.search(r"output shape:\s+\(2, 10, 512\)", out)
    assert re.search(r"attention weight shape:\s+\(2, 8, 10, 10\)", out)
    rows = re.findall(r"backend=(\S+)\s+ran=(\S+)\s+max\|diff vs math\|=(\S+)", out)
    assert {r[0] for r in rows} == {*bertattn.BACKENDS, "auto"}
    assert len(rows) == len(bertattn.BACKENDS) + 1
    for requested, ran, diff in rows:
        assert ran == ("sdpa" if requested == "auto" else requested)
        assert float(diff) < 1e-5, (requested, diff)
    assert r.err == ""


# ---------------------------------------------------------------------- the runners themselves
def test_cli_usage_error_is_exit_2_not_an_exception(cli) -> None:
    r = cli("encode")  # INPUT missing: argparse exits
    assert r.code == 2 and r.out == ""
    assert "usage: bertattn encode" in r.err and "required: input" in r.err
    r = cli("attend")  # no TEXT nor --file: the options refuse it, in one line
    assert r.code == 2 and r.out == ""
    assert r.err == "bertattn attend: error: no text: give TEXT, - to read stdin, or --file PATH.\n"
    assert cli("--help").code == 0


def test_cli_stdin_cwd_and_state_put_back(cli, tiny_checkpoint, tmp_path) -> None:
    sigterm = signal.getsignal(signal.SIGTERM)
    showwarning = warnings.showwarning
    r = cli(
        "encode", "-", "-o", "out.npy", "--model", tiny_checkpoint,
        input="hello world\n\nthe attention head\n",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.code == 0, r
    assert "3 texts (1 empty" in r.err and r.out == ""
    want = Bert.load(tiny_checkpoint).encode(["hello world", "", "the attention head"])
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-6)
    assert os.getcwd() != str(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is sigterm  # encode installs its own handler
    assert warnings.showwarning is showwarning


def test_cli_env_overrides_and_dropped_variables(cli, tiny_checkpoint, tmp_path, monkeypatch):
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {i} of the text\n" for i in range(40)))
    args = ["encode", src, "-o", tmp_path / "o.npy", "--model", tiny_checkpoint]
    args += ["--resumable", "--chunk-size", "100"]
    monkeypatch.setenv("BERTATTN_TEST_FAIL_CHUNK", "0")  # not inherited by the command
    monkeypatch.setenv("RANK", "7")  # nor torchrun's variables
    r = cli(*args, env={"BERTATTN_TEST_FAIL_CHUNK": "2"})
    assert r.code == 1, r
    assert "failed on chunk 2" in r.err and "BERTATTN_TEST_FAIL_CHUNK=2" in r.err
    assert os.environ["BERTATTN_TEST_FAIL_CHUNK"] == "0" and os.environ["RANK"] == "7"
    r = cli(*args)  # resumes: chunks 0 and 1 were kept
    assert r.code == 0, r
    assert np.load(tmp_path / "o.npy").shape == (40, 32)


@pytest.mark.slow
def test_cli_subprocess_is_the_same_command(cli, cli_subprocess, tiny_checkpoint, tmp_path):
    data = "hello world\n\nthe attention head\n"
    common = ["--model", tiny_checkpoint]
    a = cli("encode", "-", "-o", tmp_path / "a.npy", *common, input=data)
    b = cli_subprocess("encode", "-", "-o", "b.npy", *common, input=data.encode(), cwd=tmp_path)
    assert a.code == b.code == 0, b
    summary = "3 texts (1 empty, 0 truncated to 128 tokens), 3 x 32 float32"
    assert summary in a.err and summary in b.err and "b.npy" in b.err
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    assert b.argv[:3] == ("-m", "bertattn", "encode")
    env = cli_subprocess.env({"HF_HUB_OFFLINE": None, "X_EXTRA": "1"})
    assert "HF_HUB_OFFLINE" not in env and env["X_EXTRA"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("src")
    assert cli_subprocess.command("demo")[0] == sys.executable


@pytest.mark.slow
def test_cli_subprocess_bad_input_is_exit_2_without_traceback(cli_subprocess, tmp_path):
    r = cli_subprocess("encode", tmp_path / "missing.txt", "-o", tmp_path / "o.npy")
    assert r.code == 2, r
    assert r.err.startswith("bertattn encode: error:") and "Traceback" not in r.err


def test_cli_subprocess_popen_block_kills_what_still_runs(cli_subprocess):
    with cli_subprocess.popen("demo", stdout=subprocess.PIPE) as proc:
        assert proc.poll() is None  # still importing torch
    assert proc.returncode == -signal.SIGKILL
