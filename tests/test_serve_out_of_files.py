"""A server that runs out of open files (EMFILE) while accepting: asyncio reports it once per
connection waiting in the backlog, again on each retry (the hostile round saw ~10,000
tracebacks, 4 MB of log, in 2 s). ``bertattn serve`` logs one line naming the fix, accepting
pauses and resumes, and ``/live`` answers again as soon as files are free. A real server under
``prlimit`` (64 files, the connection cap set above it so the cap does not protect it), on
127.0.0.1, 150 connections."""

from __future__ import annotations

import shutil
import socket
import time

import pytest
from serve_server import FileLimited, running_server, wait_live

from bertattn.serve.runner import AcceptErrors


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_out_of_files_logs_one_line_and_live_comes_back(cli_subprocess, tiny_checkpoint):
    limited = FileLimited(cli_subprocess, 64)
    args = ("--threads", "1", "--max-connections", "1000", "--header-timeout", "30")
    with running_server(limited, tiny_checkpoint, *args) as srv:
        held = []
        try:
            for _ in range(150):
                held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
            time.sleep(2.5)  # a couple of retries of the paused accept, all failing
        finally:
            for sock in held:
                sock.close()
        wait_live(srv, 5, timeout=1)
        log = srv.stderr()
    lines = [line for line in log.splitlines() if "cannot accept connections" in line]
    assert len(lines) == 1, log[-2000:]
    assert "Too many open files" in lines[0] and "ulimit -n" in lines[0]
    assert "--max-connections" in lines[0]
    assert "Traceback" not in log and len(log) < 4000, log[-2000:]


def test_other_loop_errors_go_to_the_handler_before():
    seen: list[dict] = []
    handler = AcceptErrors(lambda loop, context: seen.append(context))
    handler(None, {"message": "something else", "exception": RuntimeError("x")})
    out = OSError(24, "Too many open files")
    for _ in range(5):
        handler(None, {"message": "socket.accept() out of system resource", "exception": out})
    assert [c["message"] for c in seen] == ["something else"] and handler.count == 5
