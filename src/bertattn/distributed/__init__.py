"""Distributed, resumable, lossless encoding of many texts (what ``bertattn encode`` runs under
torchrun, with ``--workers N``, or with ``--resumable``; the job around it — reading the input,
the options, writing the output — is :mod:`bertattn.jobs.encode`).

plan.py     chunks of consecutive lines, their balanced assignment to ranks, run identity
store.py    the parts folder next to the output: manifest, chunk parts, assembly
runner.py   one rank's run: plan (rank 0), encode its chunks, wait, assemble (rank 0)
launch.py   ``--workers N``: the same command as N local ranks through torchrun
"""

from .launch import launch_workers
from .plan import Chunk, assign_chunks, chunk_token_target, make_chunks
from .runner import (
    ChunkedSummary,
    ChunkFailed,
    DistributedEncodeError,
    RankInfo,
    encode_chunked,
    run_identity,
)
from .store import PartsFolder

__all__ = [
    "Chunk",
    "ChunkFailed",
    "ChunkedSummary",
    "DistributedEncodeError",
    "PartsFolder",
    "RankInfo",
    "assign_chunks",
    "chunk_token_target",
    "encode_chunked",
    "launch_workers",
    "make_chunks",
    "run_identity",
]
