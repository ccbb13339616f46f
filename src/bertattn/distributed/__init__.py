"""Distributed, resumable, lossless encoding of a corpus (what ``bertattn encode`` runs under
torchrun, with ``--workers N``, with ``--resumable`` or into a sharded output folder; the job
around it — the options, the model, reading a chunk's lines — is :mod:`bertattn.jobs.encode`).

plan.py     byte-range chunks at line boundaries (O(chunks) to plan), run identity
store.py    the chunk folder: manifest, claims, shards, counts, the index
group.py    ranks: torch.distributed, or one process alone
runner.py   one rank's run: plan (rank 0), take and encode chunks, wait, finish (rank 0)
launch.py   ``--workers N``: the same command as N local ranks through torchrun
"""

from .group import Group, RankInfo, SoloGroup, TorchGroup
from .launch import WorkersResult, launch_workers, run_workers
from .plan import Chunk, auto_chunk_bytes, make_chunks
from .runner import (
    ChunkedSummary,
    ChunkFailed,
    DistributedEncodeError,
    failure_message,
    run_chunks,
    run_identity,
)
from .store import ChunkStore, Piece

__all__ = [
    "Chunk",
    "ChunkFailed",
    "ChunkStore",
    "ChunkedSummary",
    "DistributedEncodeError",
    "Group",
    "Piece",
    "RankInfo",
    "SoloGroup",
    "TorchGroup",
    "WorkersResult",
    "auto_chunk_bytes",
    "failure_message",
    "launch_workers",
    "make_chunks",
    "run_chunks",
    "run_identity",
    "run_workers",
]
