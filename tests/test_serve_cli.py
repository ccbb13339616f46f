"""`bertattn serve` on the command line: options refused before the model loads (exit 2, one
line naming the flag), start-up failures in one line (exit 1: a missing extra, a port in use, a
bad model), the warning for a non-local host without a key, and a --help that imports no server
package."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from bertattn.jobs.serve_options import ServeOptions


def test_defaults():
    o = ServeOptions()
    assert (o.host, o.port, o.max_batch_tokens, o.device) == ("127.0.0.1", 8080, 16384, "auto")
    assert o.truncate is None and o.api_key is None and o.max_body_bytes == 16 << 20


@pytest.mark.parametrize(
    "argv",
    [
        ["--port", "70000"],
        ["--port", "-1"],
        ["--max-batch-tokens", "0"],
        ["--max-queue-tokens", "100"],
        ["--max-request-inputs", "0"],
        ["--max-decode-ids", "0"],
        ["--max-input-tokens", "2"],
        ["--max-input-tokens", "512", "--max-batch-tokens", "256"],
        ["--drain-timeout", "-1"],
        ["--drain-timeout", "nan"],
        ["--max-queue-time", "-1"],
        ["--max-queue-time", "inf"],
        ["--max-body-size", "12Q"],
        ["--api-key", " "],
        ["--device", "tpu"],
        ["--host", "a b"],
        ["--threads", "0"],
    ],
    ids=" ".join,
)
def test_refused_before_loading(cli, argv):
    """Each bad value is refused in one line naming its flag (the argv's first word)."""
    flag = argv[0]
    r = cli("serve", "--model", "/nonexistent/model", *argv)  # never loaded
    assert r.code == 2, r
    assert flag in r.err and "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err


def test_max_input_tokens_above_the_model(cli, tiny_checkpoint):
    r = cli("serve", "--model", tiny_checkpoint, "--port", "0", "--max-input-tokens", "1000")
    assert r.code == 2, r
    assert "--max-input-tokens 1000 is more than the model takes (128 tokens)" in r.err, r.err


def test_help_imports_no_server_package():
    code = (
        "import sys\n"
        "from bertattn.cli import build_parser\n"
        "build_parser().parse_args(['serve', '--port', '9'])\n"
        "print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_missing_extra_names_the_pip_install(cli_subprocess, tiny_checkpoint, tmp_path):
    fake = tmp_path / "starlette"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no starlette', name='starlette')\n")
    r = cli_subprocess(
        "serve", "--model", tiny_checkpoint, "--port", "0", env={"PYTHONPATH": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    assert r.code == 1, r
    assert "pip install 'bertattn[serve]'" in r.err and "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.slow
def test_port_in_use_and_the_open_host_warning(cli_subprocess, tiny_checkpoint):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = cli_subprocess(
            "serve", "--model", tiny_checkpoint, "--host", "0.0.0.0", "--port", port, timeout=120
        )
    assert r.code == 1, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 2, r.err
    assert "warning:" in lines[0] and "no API key" in lines[0] and "--api-key" in lines[0]
    assert f"cannot listen on 0.0.0.0:{port}" in lines[1] and "--port" in lines[1], r.err


@pytest.mark.slow
def test_bad_model_is_one_line(cli_subprocess, tiny_checkpoint, tmp_path):
    missing = cli_subprocess("serve", "--model", tmp_path / "missing", "--port", "0", timeout=120)
    assert missing.code == 2, missing  # a path that is not a model: a usage error, as encode's
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "config.json").write_text("{not json")
    bad = cli_subprocess("serve", "--model", broken, "--port", "0", timeout=120)
    assert bad.code == 1, bad  # a malformed model folder
    for r in (missing, bad):
        assert "error:" in r.err and "Traceback" not in r.err, r.err
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert "config.json" in bad.err
