"""A real ``bertattn serve`` process for the serve tests: started on a free port of
127.0.0.1, polled on ``/live`` until up (bounded), killed with its session at the end.

    with running_server(cli_subprocess, tiny_checkpoint, "--api-key", "k") as server:
        httpx.post(server.url + "/v1/embeddings", json=...)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

START_TIMEOUT = 90.0  # seconds: torch import + model load on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def wait(self, timeout: float = 60) -> int:
        """The exit status (fails the test when it does not end in time)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop within {timeout} s\n{self.stderr()[-3000:]}")


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what this test started
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def start_server(cli_subprocess, model: Path | str, *args: object, env=None) -> Server:  # type: ignore[no-untyped-def]
    """Start ``bertattn serve --model MODEL --port P ARGS`` and wait for ``/live``."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="bertattn-serve-", suffix=".log")[1])
    cmd = cli_subprocess.command("serve", "--model", model, "--port", port, *args)
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_subprocess.env(env),
            start_new_session=True,
        )
    server = Server(proc, port, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode}\n{server.stderr()[-3000:]}")
        try:
            if httpx.get(server.url + "/live", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    _kill(proc)
    pytest.fail(f"the server was not live within {START_TIMEOUT} s\n{server.stderr()[-3000:]}")


@contextlib.contextmanager
def running_server(cli_subprocess, model: Path | str, *args: object, env=None) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    server = start_server(cli_subprocess, model, *args, env=env)
    try:
        yield server
    finally:
        _kill(server.proc)
        server.stderr_path.unlink(missing_ok=True)


def assert_encode_and_serve_give(  # type: ignore[no-untyped-def]
    cli, cli_subprocess, folder: Path, texts: list[str], want: np.ndarray, tmp_path: Path
) -> tuple[np.ndarray, dict]:
    """``bertattn encode`` (the command line on a corpus file of ``texts``, a .npy output) and
    ``bertattn serve`` (a real server, the OpenAI embeddings body) on ``folder`` each give the
    rows ``want`` ``(N, E)`` within 1e-5; returns the served rows and the server's /info."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    r = cli("encode", src, "-o", tmp_path / "out.npy", "--model", folder)
    assert r.code == 0, r
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-5, rtol=0)
    with running_server(cli_subprocess, folder) as server:
        body = {"input": texts, "model": Path(folder).name}
        got = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
        assert got.status_code == 200, got.text
        rows = np.array([d["embedding"] for d in got.json()["data"]], dtype=np.float32)
        info = httpx.get(server.url + "/info", timeout=30).json()
    np.testing.assert_allclose(rows, want, atol=1e-5, rtol=0)
    return rows, info


def metrics(server, timeout: float = 10) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The server's ``/metrics``, each sample line as ``{name{labels}: value}``."""
    out = {}
    for line in httpx.get(server.url + "/metrics", timeout=timeout).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def error_envelope(r: httpx.Response) -> dict:
    """The ``error`` object of a JSON error answer, checked to hold exactly its four fields."""
    assert r.headers["content-type"].startswith("application/json"), r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def wait_live(server: Server, within: float, poll: float = 0.1, timeout: float = 2) -> None:  # type: ignore[no-untyped-def]
    """Poll ``/live`` until it answers 200; fail the test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(server.url + "/live", timeout=timeout).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "/live did not come back"
        time.sleep(poll)


def wait_queued(server: Server, within: float = 30) -> None:
    """Wait until a request waits in the server's queue (its metrics say so)."""
    deadline = time.monotonic() + within
    while metrics(server).get("bertattn_queue_requests", 0) < 1:
        assert time.monotonic() < deadline, "the request was never queued"
        time.sleep(0.05)


class FileLimited:
    """``cli_subprocess`` whose server runs under ``prlimit --nofile=FILES``."""

    def __init__(self, cli, files: int) -> None:  # type: ignore[no-untyped-def]
        self.cli, self.files = cli, files

    def env(self, env=None):  # type: ignore[no-untyped-def]
        return self.cli.env(env)

    def command(self, *argv: object) -> list[str]:
        return ["prlimit", f"--nofile={self.files}:{self.files}", "--", *self.cli.command(*argv)]
