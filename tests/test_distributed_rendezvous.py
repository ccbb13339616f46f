"""A torchrun rank whose peers never come: one process started as one rank of two (the
environment torchrun would give it, with no other rank behind it). The rendezvous gives up
after ``--timeout`` seconds with one line that says who did not join, where (MASTER_ADDR /
MASTER_PORT) and the fix; exit 1, no Python traceback, no output. (A rank other than 0 also
gets torch's own c10d log lines from C++, "[E... socket.cpp] ... timed out", before it.)"""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.slow  # real processes, a few seconds of waiting each


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "rank, who",
    [
        (0, "1 of the other 1 rank(s) did not join within 3 s"),
        (1, "rank 1 could not reach rank 0 within 3 s"),
    ],
    ids=["rank0-alone", "rank1-alone"],
)
def test_a_peer_that_never_joins(rank, who, tmp_path, cli_subprocess, tiny_checkpoint):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    port = _free_port()
    env = {
        "WORLD_SIZE": "2",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "CUDA_VISIBLE_DEVICES": "",
    }
    r = cli_subprocess(
        "encode", tmp_path / "in.txt", "-o", tmp_path / "o.npy", "--model", tiny_checkpoint,
        "--timeout", "3", env=env, timeout=120,
    )  # fmt: skip
    assert r.code == 1, r
    assert "Traceback" not in r.err and "DistStoreError" not in r.err, r.err
    errors = [line for line in r.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and r.err.strip().splitlines()[-1] == errors[0], r.err
    line = errors[0]
    if rank == 0:
        assert r.err.strip() == line, r.err
    assert line.startswith(f"bertattn encode: rank {rank}: error: {who}"), line
    assert f"at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} (WORLD_SIZE=2)" in line, line
    assert "with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE" in line, line
    assert "--timeout SECONDS" in line, line
    assert not (tmp_path / "o.npy").exists()
