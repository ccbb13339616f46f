"""A corpus and ranks that need no hardware: a virtual file of any number of lines (its bytes
computed, never stored) and ranks as threads of this process, for the scale tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import BinaryIO

WIDTH = 13  # every line of the virtual file: 12 digits and a newline


class VirtualLines:
    """``lines`` lines, line ``i`` (0-based) being ``f"{i:012d}\\n"``, read by byte range like a
    file on disk (the same members as :class:`bertattn.corpus.InputFile`). ``reads`` and
    ``bytes_read`` count what was asked of it."""

    compression = None
    jsonl = False

    def __init__(self, lines: int, name: str = "virtual.txt") -> None:
        self.lines = lines
        self.size = lines * WIDTH
        self.name = name
        self.reads = 0
        self.bytes_read = 0
        self._lock = threading.Lock()

    def read_at(self, offset: int, n: int) -> bytes:
        end = min(self.size, offset + n)
        if offset >= end:
            return b""
        first, last = offset // WIDTH, (end - 1) // WIDTH
        text = "".join(f"{i:012d}\n" for i in range(first, last + 1)).encode()
        skip = offset - first * WIDTH
        out = text[skip : skip + end - offset]
        with self._lock:
            self.reads += 1
            self.bytes_read += len(out)
        return out

    def open_stream(self) -> BinaryIO:
        raise AssertionError("a plain file is read by byte range")

    def identity(self) -> dict:
        return {"path": self.name, "size": self.size, "mtime_ns": 0, "sample_sha256": "virtual"}


class ThreadGroup:
    """Rank ``rank`` of ``world_size`` simulated ranks (threads sharing ``shared``)."""

    def __init__(self, shared: dict, rank: int, world_size: int) -> None:
        self.shared, self.rank, self.world_size = shared, rank, world_size

    @staticmethod
    def shared_state(world_size: int) -> dict:
        return {"barrier": threading.Barrier(world_size, timeout=5), "box": None}

    def broadcast(self, obj: object) -> object:
        if self.rank == 0:
            self.shared["box"] = obj
        self.shared["barrier"].wait()
        return self.shared["box"]

    def barrier(self) -> None:
        self.shared["barrier"].wait()

    def close(self) -> None:
        pass


def run_ranks(world_size: int, body: Callable[[ThreadGroup], object]) -> list[object]:
    """Run ``body(group)`` on ``world_size`` thread ranks; per rank its result or exception."""
    shared = ThreadGroup.shared_state(world_size)
    results: list[object] = [None] * world_size

    def one(rank: int) -> None:
        try:
            results[rank] = body(ThreadGroup(shared, rank, world_size))
        except BaseException as exc:  # noqa: BLE001  (a rank's end, whatever it was, is the result)
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
