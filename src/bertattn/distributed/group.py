"""Which rank this process is, and the two collectives a chunked run needs (broadcast the plan,
a barrier before the result is written).

:class:`TorchGroup` uses torch.distributed (torchrun's env:// rendezvous; gloo on CPU, nccl on
CUDA); :class:`SoloGroup` is one process alone. Anything with the same members can stand in:
the tests run simulated ranks as threads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from ..errors import JobError

__all__ = ["Group", "RankInfo", "SoloGroup", "TorchGroup"]


@dataclass(frozen=True)
class RankInfo:
    """``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` as torchrun sets them (1 / 0 / 0 without)."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> RankInfo:
        values = []
        for name, default in (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
            raw = os.environ.get(name, "")
            try:
                values.append(int(raw) if raw else default)
            except ValueError:
                raise ValueError(
                    f"environment variable {name}={raw!r} is not an integer."
                ) from None
        info = cls(*values)
        if info.world_size < 1 or not 0 <= info.rank < info.world_size:
            raise ValueError(f"RANK={info.rank} is not in 0..WORLD_SIZE-1 ({info.world_size}).")
        return info

    @property
    def device(self) -> Any:
        """``cuda:LOCAL_RANK`` with CUDA, else the CPU (a ``torch.device``)."""
        import torch

        return torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")


class Group(Protocol):
    rank: int
    world_size: int

    def broadcast(self, obj: object) -> object:
        """Rank 0's ``obj`` on every rank."""
        ...

    def barrier(self) -> None: ...

    def close(self) -> None: ...


class SoloGroup:
    """One process alone (rank 0 of 1)."""

    rank = 0
    world_size = 1

    def broadcast(self, obj: object) -> object:
        return obj

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


def _rendezvous_failed(info: RankInfo, timeout: float, exc: BaseException) -> str:
    """One line for a torchrun rendezvous that failed: who waited for whom, where, how long,
    and the fix (the ``DistStoreError`` says "Timed out after 6 seconds waiting for clients.
    1/2 clients joined." in a traceback of C++ frames)."""
    addr = os.environ.get("MASTER_ADDR", "?")
    port = os.environ.get("MASTER_PORT", "?")
    where = f"MASTER_ADDR={addr} MASTER_PORT={port}"
    detail = " ".join(str(exc).split("\n")[0].split())
    if "time" not in detail.lower():  # not a timeout: e.g. the port is taken
        return (
            f"rank {info.rank} of {info.world_size} could not join the run at {where}: "
            f"{detail}; start every rank with the same free MASTER_ADDR / MASTER_PORT."
        )
    joined = re.search(r"(\d+)/(\d+) clients joined", detail)
    if info.rank == 0:
        missing = info.world_size - int(joined[1]) if joined else info.world_size - 1
        who = f"{missing} of the other {info.world_size - 1} rank(s) did not join"
    else:
        who = f"rank {info.rank} could not reach rank 0"
    return (
        f"{who} within {timeout:g} s at {where} (WORLD_SIZE={info.world_size}): start all "
        f"{info.world_size} ranks (torchrun --nproc-per-node, or one per node with --nnodes) "
        f"with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or give them longer with "
        f"--timeout SECONDS."
    )


class TorchGroup:
    """torch.distributed's default group: joined here when torchrun's environment says there
    are several ranks and no group exists yet (and left again by :meth:`close`)."""

    def __init__(self, info: RankInfo, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.rank, self.world_size = info.rank, info.world_size
        self._joined = False
        if info.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(info.local_rank)
            try:
                dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
            except dist.DistError as exc:  # the rendezvous: a peer that never came, a port
                raise JobError(_rendezvous_failed(info, timeout, exc)) from exc
            self._joined = True

    def broadcast(self, obj: object) -> object:
        if self.world_size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self._joined:
            import torch.distributed as dist

            dist.destroy_process_group()
            self._joined = False
