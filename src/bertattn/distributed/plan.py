"""Planning a chunked encode: chunks of consecutive lines, their assignment to ranks, and the
identity (input, model, settings) that the manifest records so a rerun can resume safely.

Everything here is deterministic: the same token counts and target give the same chunks, the
same chunks and world size give the same assignment.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

__all__ = [
    "FORMAT_VERSION",
    "Chunk",
    "assign_chunks",
    "check_identity",
    "chunk_token_target",
    "make_chunks",
    "sha256_file",
    "sha256_files",
]

FORMAT_VERSION = 1
MAX_AUTO_CHUNK_TOKENS = 65536  # auto chunks: at most this many tokens ...
MIN_AUTO_CHUNK_TOKENS = 8192  # ... at least this many (many batches: little padding) ...
AUTO_CHUNKS = 64  # ... and about this many chunks in between (balance for up to ~16 ranks)


@dataclass(frozen=True)
class Chunk:
    """Lines ``start`` (inclusive) to ``end`` (exclusive), 0-based; ``tokens``: their token
    count (specials included, after truncation), the unit of work."""

    index: int
    start: int
    end: int
    tokens: int

    @property
    def lines(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"chunk {self.index} (lines {self.start + 1}-{self.end})"

    def to_list(self) -> list[int]:
        return [self.index, self.start, self.end, self.tokens]

    @classmethod
    def from_list(cls, row: Sequence[int]) -> Chunk:
        index, start, end, tokens = (int(x) for x in row)
        return cls(index, start, end, tokens)


def chunk_token_target(total_tokens: int, chunk_tokens: int | None = None) -> int:
    """Tokens per chunk: ``chunk_tokens`` when given, else ``total / 64`` clamped to
    [8192, 65536] (a function of the input only, never of the world size, so a rerun with
    another number of ranks finds the same chunks)."""
    if chunk_tokens is not None:
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}.")
        return chunk_tokens
    return min(
        MAX_AUTO_CHUNK_TOKENS, max(MIN_AUTO_CHUNK_TOKENS, math.ceil(total_tokens / AUTO_CHUNKS))
    )


def make_chunks(token_counts: Sequence[int], target: int) -> list[Chunk]:
    """Cut lines into consecutive chunks of at most ``target`` tokens (a single longer line is a
    chunk of its own). Together the chunks cover every line exactly once, in order."""
    if target < 1:
        raise ValueError(f"target must be >= 1 token, got {target}.")
    chunks: list[Chunk] = []
    start = acc = 0
    for i, n in enumerate(token_counts):
        if i > start and acc + n > target:
            chunks.append(Chunk(len(chunks), start, i, acc))
            start, acc = i, 0
        acc += int(n)
    if start < len(token_counts):
        chunks.append(Chunk(len(chunks), start, len(token_counts), acc))
    return chunks


def check_partition(chunks: Sequence[Chunk], lines: int) -> None:
    """Raise unless ``chunks`` (in index order) cover lines ``0 .. lines-1`` exactly once."""
    pos = 0
    for i, c in enumerate(chunks):
        if c.index != i or c.start != pos or c.end <= c.start:
            raise ValueError(
                f"the chunk list is inconsistent at {c.describe()} (expected chunk {i} starting "
                f"at line {pos + 1}); pass --restart to discard it."
            )
        pos = c.end
    if pos != lines:
        raise ValueError(
            f"the chunks cover {pos} lines but the input has {lines}; pass --restart to discard "
            f"them."
        )


def assign_chunks(chunks: Sequence[Chunk], world_size: int) -> list[list[Chunk]]:
    """Balance chunks over ranks by token count: greedy longest-processing-time (the biggest
    chunk first, to the least-loaded rank; ties go to the lower chunk index and the lower rank).
    Returns one list per rank, each in chunk order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}.")
    heap = [(0, rank) for rank in range(world_size)]  # (tokens so far, rank)
    out: list[list[Chunk]] = [[] for _ in range(world_size)]
    for chunk in sorted(chunks, key=lambda c: (-c.tokens, c.index)):
        load, rank = heapq.heappop(heap)
        out[rank].append(chunk)
        heapq.heappush(heap, (load + chunk.tokens, rank))
    return [sorted(mine, key=lambda c: c.index) for mine in out]


# ---------------------------------------------------------------------- identity
def sha256_file(path: Path, *, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while data := f.read(block):
            h.update(data)
    return h.hexdigest()


def sha256_files(paths: Sequence[Path]) -> str:
    """One digest over several files: sha256 of the lines ``name sha256``."""
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in paths)
    return hashlib.sha256(lines.encode()).hexdigest()


def _short(digest: str) -> str:
    return digest[:12]


def check_identity(old: dict, new: dict, parts_dir: Path) -> None:
    """Raise ``UsageError`` (the fix is ``--restart``) naming what differs between a
    manifest's identity and this run's."""
    fix = (
        f"pass --restart to discard the finished chunks in {parts_dir}, or rerun with what the "
        f"interrupted run used"
    )
    if old.get("format") != new["format"]:
        raise UsageError(
            f"{parts_dir} was written in parts format {old.get('format')!r}, this bertattn "
            f"writes format {new['format']} — {fix}."
        )
    o_in, n_in = old.get("input", {}), new["input"]
    if o_in.get("sha256") != n_in["sha256"]:
        raise UsageError(
            f"the input file changed since the interrupted run (sha256 "
            f"{_short(str(o_in.get('sha256')))}…, now {_short(n_in['sha256'])}…) — {fix}."
        )
    o_m, n_m = old.get("model", {}), new["model"]
    if o_m.get("sha256") != n_m["sha256"]:
        raise UsageError(
            f"the model changed since the interrupted run (files sha256 "
            f"{_short(str(o_m.get('sha256')))}… in {o_m.get('path')}, now "
            f"{_short(n_m['sha256'])}… in {n_m['path']}) — {fix}."
        )
    o_s, n_s = old.get("settings", {}), new["settings"]
    diff = [f"{k} {o_s.get(k)!r} -> {n_s.get(k)!r}" for k in n_s if o_s.get(k) != n_s.get(k)]
    if diff:
        raise UsageError(
            f"the settings changed since the interrupted run ({', '.join(diff)}) — {fix}."
        )
