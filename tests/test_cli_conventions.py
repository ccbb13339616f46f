"""Unix conventions of the command line: data on stdout and status on stderr, `-` for stdout,
progress bars only on a terminal (a real pseudo-terminal here), -q / -v, ids carried into
JSON lines written by the json module, and no torch import for --help / --version."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertattn.jobs.encode import embeddings_payload

SRC = Path(__file__).resolve().parents[1] / "src"


def test_help_and_version_do_not_import_torch():
    code = (
        "import sys; from bertattn.cli import main; "
        "c = main(['--version']); h = main(['--help']); "
        "print(c, h, 'torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("0 0 False"), proc.stdout
    assert "bertattn 0.1.0" in proc.stdout


def test_encode_to_stdout_with_ids(cli, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a1", "text": "hello"}\n{"id": 7, "text": "world"}\n')
    r = cli("encode", str(src), "-o", "-", "--id-field", "id")
    assert r.code == 0, r
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [row["id"] for row in rows] == ["a1", 7] and [row["index"] for row in rows] == [0, 1]
    assert all(len(row["embedding"]) == 384 for row in rows)
    assert "bertattn encode: <stdout>: 2 texts" in r.err  # the summary on stderr
    r = cli("encode", str(src), "-o", str(tmp_path / "o.jsonl"), "--id-field", "id", "-q")
    assert r.code == 0 and r.err == "" and r.out == "", r
    lines = (tmp_path / "o.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["id"] == "a1"


@pytest.mark.parametrize("command", ["encode", "attend"])
def test_quiet_silences_status_but_not_a_warning_about_lost_text(command, cli, tmp_path):
    """-q drops the summary / "wrote" lines; a warning that text was cut off still appears
    (one line, no traceback): quiet is not blind."""
    long = " ".join(["word"] * 40)
    if command == "encode":
        (tmp_path / "in.txt").write_text(f"short\n{long}\n")
        argv = ["encode", str(tmp_path / "in.txt"), "-o", str(tmp_path / "o.npy")]
    else:
        argv = ["attend", long, "--json", str(tmp_path / "a.json")]
    argv += ["--max-length", "16"]
    loud, quiet = cli(*argv), cli(*argv, "-q")
    assert loud.code == 0 and quiet.code == 0, (loud, quiet)
    warning = [line for line in quiet.err.splitlines() if "truncated" in line]
    assert len(warning) == 1 and f"bertattn {command}: warning:" in warning[0], quiet.err
    assert quiet.err.strip() == warning[0] and len(loud.err.splitlines()) > 1, (loud, quiet)


def test_jsonl_numbers_read_back_as_the_same_float32(tmp_path):
    import io

    emb = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32) / 3
    buf = io.BytesIO()
    embeddings_payload("x.jsonl", emb, ids=["a", None, 3, {"k": 1}, [1]])(buf)
    rows = [json.loads(line) for line in buf.getvalue().decode().splitlines()]
    np.testing.assert_array_equal(np.array([r["embedding"] for r in rows], dtype=np.float32), emb)
    assert [r["id"] for r in rows] == ["a", None, 3, {"k": 1}, [1]]
    emb[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"embedding 2 holds NaN or infinity"):
        embeddings_payload("x.jsonl", emb)


def test_attend_json_to_stdout(cli):
    r = cli("attend", "hello there", "--json", "-")
    assert r.code == 0, r
    data = json.loads(r.out)
    assert data["tokens"] == ["[CLS]", "hello", "there", "[SEP]"]
    assert "wrote" not in r.out


@pytest.mark.parametrize(
    "args, message",
    [
        (["encode", "in.txt", "-o", "-", "--resumable"], "give -o FILE.npy or FILE.jsonl"),
        (["encode", "in.txt", "-o", "o.npy", "--id-field", "id"], "--id-field copies ids"),
        (["attend", "hi", "--png", "-"], "--png - is not supported"),
    ],
)
def test_stdout_refusals(cli, tmp_path, args, message):
    (tmp_path / "in.txt").write_text("hello\n")
    r = cli(*args, cwd=tmp_path)
    assert r.code == 2 and message in r.err, r


def _run_on_a_terminal(argv, env):
    """Run `python -m bertattn ARGV` with stderr on a pseudo-terminal; return what it shows."""
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 x 24
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertattn", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        seen += chunk
    proc.wait(timeout=300)
    os.close(leader)
    return proc.returncode, seen.decode(errors="replace")


@pytest.mark.slow
def test_progress_bar_only_on_a_terminal(tmp_path, cli):
    """On a pseudo-terminal (a real process) the bar shows unless TQDM_DISABLE; on a stream
    that is not a terminal (in process: ``cli``'s stderr, as a pipe's) only with --progress."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(f"line {i}" for i in range(40)) + "\n")
    # 40 texts of 4 tokens ([CLS] line N [SEP]): the bar counts the 160 tokens
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1"}
    env.pop("TQDM_DISABLE", None)
    args = ["encode", str(src), "-o", str(tmp_path / "o.npy"), "--batch-size", "8"]
    code, shown = _run_on_a_terminal(args, env)
    assert code == 0 and "encode:" in shown and "160/160" in shown and "token" in shown, shown
    code, shown = _run_on_a_terminal(args, {**env, "TQDM_DISABLE": "1"})
    assert code == 0 and "160/160" not in shown, shown
    piped = cli(*args, env={"TQDM_DISABLE": None})
    assert piped.code == 0 and "160/160" not in piped.err, piped
    forced = cli(*args, "--progress", env={"TQDM_DISABLE": None})
    assert forced.code == 0 and "160/160" in forced.err, forced


def test_verbose_logs_dispatch(cli):
    r = cli("-vv", "attend", "hello", "--json", "-")
    assert r.code == 0, r
    assert "bertattn.dispatch" in r.err and "math" in r.err


def test_cli_poolings_are_the_library_ones():
    """The options list pooling names without importing torch; they must be the library's."""
    from bertattn.encoder.folder import POOLINGS
    from bertattn.jobs.encode_options import POOLINGS as CLI_POOLINGS

    assert CLI_POOLINGS == POOLINGS


def test_the_printed_model_name_resolves_offline(cli, minilm_dir):
    """bertattn prints the default model as sentence-transformers/all-MiniLM-L6-v2; that name
    works as --model with no network and no Hugging Face cache (HF_HUB_OFFLINE is set)."""
    from bertattn.encoder.folder import resolve_model

    folder = resolve_model("sentence-transformers/all-MiniLM-L6-v2")
    assert folder.root.resolve() == minilm_dir.resolve()
    r = cli("attend", "hello", "--json", "-", "--model", "sentence-transformers/all-MiniLM-L6-v2")
    assert r.code == 0, r
    assert json.loads(r.out)["model_name"] == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.parametrize("command", [["encode", "in.txt", "-o", "o.npy"], ["attend", "hi"]])
def test_device_option(cli, tmp_path, command):
    import torch

    (tmp_path / "in.txt").write_text("hello\n")
    r = cli(*command, "--device", "gpu", cwd=tmp_path)
    assert r.code == 2 and "--device 'gpu' is not one of auto" in r.err, r
    r = cli(*command, "--device", "cuda", cwd=tmp_path)
    if torch.cuda.is_available():  # the GPU path runs and agrees with the CPU
        assert r.code == 0, r
    else:
        assert r.code == 2 and "CUDA is not available here" in r.err, r
    r = cli(*command, "--device", "cpu", cwd=tmp_path)
    assert r.code == 0, r
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["in.txt", "o.npy"] if command[0] == "encode" else ["in.txt"]
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--foo"], "bertattn bench: error: unrecognized arguments: --foo"),
        (["demo", "extra"], "bertattn demo: error: unrecognized arguments: extra"),
        (["attend", "hi", "--foo"], "bertattn attend: error: unrecognized arguments: --foo"),
        (
            ["encode", "a.txt", "b.txt", "c.txt", "-o", "o.npy"],
            "bertattn encode: error: encode takes one INPUT, got 3 paths (a.txt, b.txt, c.txt): "
            "a shell glob expands into every file it matches; quote it",
        ),
    ],
)
def test_unknown_arguments_are_reported_by_the_subcommand(cli, tmp_path, argv, message):
    """Every parse error names the subcommand and shows its usage, as the other errors do."""
    r = cli(*argv, cwd=tmp_path)
    assert r.code == 2, r
    assert message in r.err, r.err
    assert f"usage: bertattn {argv[0]}" in r.err, r.err
    assert not list(tmp_path.iterdir())
