"""The chunked, resumable encode, on one rank of N (N = 1 works too).

Each rank runs :func:`encode_chunked`. Rank 0 locks the parts folder, plans (reads or writes the
manifest, finds the finished chunks, balances the pending ones over the ranks) and broadcasts the
plan; every rank encodes its chunks on its own device and writes each one to the parts folder;
all ranks wait until every part exists (polling the folder, so a slow rank is never mistaken for
a dead one: a run fails only when a rank reports a failure or no chunk finishes for ``timeout``
seconds); after a barrier rank 0 assembles the embeddings in input order, hands them to the
caller's ``write`` and removes the parts folder. Reading the input and writing the output are
the job's (:mod:`bertattn.jobs.encode`).

The output equals a single-process encode up to float rounding (≤ 1e-6 here, not always
byte-identical): batches are formed within a chunk (sorted by length, deterministic), so they
differ from the whole-file batches.

Test hooks (environment variables, read by every rank): ``BERTATTN_TEST_FAIL_CHUNK=3`` (or
``3,5``) makes encoding those chunks raise; ``BERTATTN_TEST_CHUNK_DELAY=0.5`` sleeps that many
seconds after each chunk is written.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from ..files import FolderLock
from .plan import (
    FORMAT_VERSION,
    Chunk,
    assign_chunks,
    check_identity,
    check_partition,
    chunk_token_target,
    make_chunks,
    sha256_file,
    sha256_files,
)
from .store import PartsFolder

logger = logging.getLogger("bertattn.distributed")

__all__ = [
    "ChunkFailed",
    "ChunkedSummary",
    "DistributedEncodeError",
    "RankInfo",
    "encode_chunked",
    "run_identity",
]

DEFAULT_TIMEOUT = 1800.0
_POLL = 0.2


class DistributedEncodeError(RuntimeError):
    """A chunked run stopped: a rank failed, a peer vanished, or rank 0 refused the plan."""


class ChunkFailed(DistributedEncodeError):
    """Encoding a chunk raised (on this rank or, reported through the parts folder, another)."""


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
    def device(self) -> torch.device:
        return torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")


@dataclass
class ChunkedSummary:
    """What a chunked run did (rank 0), for the final report line."""

    texts: int
    empty: int
    truncated: int
    max_length: int
    width: int
    tokens: int
    padded: int
    seconds: float
    world_size: int
    chunks: int
    computed: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)
    computed_lines: int = 0
    rank_tokens: list[int] = field(default_factory=list)

    @property
    def padding_ratio(self) -> float:
        return 1.0 - self.tokens / self.padded if self.padded else 0.0

    def __str__(self) -> str:
        rate = self.computed_lines / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"{self.texts} lines ({self.empty} empty, {self.truncated} truncated to "
            f"{self.max_length} tokens), {self.tokens} tokens, padding {self.padding_ratio:.1%} "
            f"({self.texts} x {self.width} float32) in {self.seconds:.1f}s, "
            f"{rate:.1f} sentences/s; {self.world_size} rank(s), {self.chunks} chunks: "
            f"{len(self.computed)} computed, {len(self.reused)} reused"
        )


# ---------------------------------------------------------------------- process group
def _init_group(info: RankInfo, timeout: float) -> bool:
    """Join torchrun's process group (env:// rendezvous): nccl on CUDA, gloo on CPU."""
    import torch.distributed as dist

    if info.world_size == 1 or dist.is_initialized():
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return True


def _broadcast(obj: object, info: RankInfo) -> object:
    if info.world_size == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _barrier(info: RankInfo) -> None:
    if info.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


# ---------------------------------------------------------------------- planning (rank 0)
def _token_counts(bert, texts: Sequence[str], limit: int, block: int = 8192) -> list[int]:
    counts: list[int] = []
    for i in range(0, len(texts), block):
        counts += [
            len(e.ids) for e in bert.tokenizer.encode_batch(texts[i : i + block], max_length=limit)
        ]
    return counts


def run_identity(
    input_path: Path, lines: int, model_name: str, model_files: Sequence[Path], settings: dict
) -> dict:
    """What a manifest records so that a rerun resumes only the same work: the input (path,
    hash, line count), the model (name, hash of its files) and the settings."""
    return {
        "format": FORMAT_VERSION,
        "input": {"path": str(input_path), "sha256": sha256_file(input_path), "lines": lines},
        "model": {"path": model_name, "sha256": sha256_files(model_files)},
        "settings": settings,
    }


def _plan(
    parts: PartsFolder,
    identity: dict,
    *,
    bert,
    texts: Sequence[str],
    limit: int,
    chunk_tokens: int | None,
    restart: bool,
    world_size: int,
) -> dict:
    """Rank 0: the chunks (from the manifest when resuming), which are done, who does the rest."""
    if restart:
        parts.clear()
    manifest = parts.read_manifest()
    if manifest is not None:
        check_identity(manifest, identity, parts.path)
        chunks = [Chunk.from_list(row) for row in manifest.get("chunks", [])]
        check_partition(chunks, len(texts))
    else:
        counts = _token_counts(bert, texts, limit)
        target = chunk_token_target(sum(counts), chunk_tokens)
        chunks = make_chunks(counts, target)
        parts.create()
        parts.write_manifest(
            {**identity, "chunk_tokens": target, "chunks": [c.to_list() for c in chunks]}
        )
    parts.clean_temp()
    parts.clear_failures()
    width = bert.model.config.hidden_size
    done = [c.index for c in chunks if parts.has_part(c, width)]
    pending = [c for c in chunks if c.index not in set(done)]
    assignment = assign_chunks(pending, world_size)
    run = {
        "world_size": world_size,
        "reused": done,
        "assignment": [[c.index for c in mine] for mine in assignment],
        "rank_tokens": [sum(c.tokens for c in mine) for mine in assignment],
    }
    parts.write_run(run)
    return {
        "chunks": [c.to_list() for c in chunks],
        "reused": done,
        "assignment": run["assignment"],
        "rank_tokens": run["rank_tokens"],
    }


# ---------------------------------------------------------------------- encoding (each rank)
def _test_hooks() -> tuple[set[int], float]:
    fail = {int(x) for x in os.environ.get("BERTATTN_TEST_FAIL_CHUNK", "").split(",") if x.strip()}
    delay = float(os.environ.get("BERTATTN_TEST_CHUNK_DELAY", "0") or 0)
    return fail, delay


def _encode_chunks(
    bert,
    texts: Sequence[str],
    mine: Sequence[Chunk],
    parts: PartsFolder,
    info: RankInfo,
    kwargs: dict,
    progress: Callable[[int], object] | None,
) -> None:
    fail, delay = _test_hooks()
    for chunk in mine:
        try:
            if chunk.index in fail:
                raise RuntimeError(f"injected failure (BERTATTN_TEST_FAIL_CHUNK={chunk.index})")
            with warnings.catch_warnings():  # truncation was reported once, by the plan
                warnings.simplefilter("ignore")
                emb, st = bert.encode_with_stats(
                    texts[chunk.start : chunk.end], progress=progress, **kwargs
                )
            stats = {
                "rows": st.texts,
                "empty": st.empty,
                "truncated": st.truncated,
                "tokens": st.tokens,
                "padded": st.padded,
                "rank": info.rank,
            }
            parts.write_part(chunk, emb, stats)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            parts.mark_failed(info.rank, chunk, error)
            raise ChunkFailed(
                f"rank {info.rank} failed on {chunk.describe()}: {error}; the finished chunks "
                f"are kept in {parts.path}: rerun the same command to resume"
            ) from exc
        if delay:
            time.sleep(delay)


def _missing(chunks: Sequence[Chunk], present: set[int]) -> str:
    gone = [c.index for c in chunks if c.index not in present]
    shown = ", ".join(map(str, gone[:20])) + (" ..." if len(gone) > 20 else "")
    return f"{len(gone)} chunk(s) not written: {shown}"


def _wait_for_parts(
    parts: PartsFolder,
    chunks: Sequence[Chunk],
    timeout: float,
    on_new: Callable[[set[int]], object],
) -> None:
    """Until every chunk's part exists; fail on a failure marker or ``timeout`` seconds
    without a new part."""
    seen = parts.present(chunks)
    last = time.monotonic()
    while len(seen) < len(chunks):
        failures = parts.failures()
        if failures:
            f = failures[0]
            raise ChunkFailed(
                f"rank {f.get('rank')} failed on {f.get('what')}: {f.get('error')}; "
                f"{_missing(chunks, parts.present(chunks))}. Rerun the same command to resume."
            )
        now = parts.present(chunks)
        if now - seen:
            on_new(now - seen)
            seen |= now
            last = time.monotonic()
        elif time.monotonic() - last > timeout:
            raise DistributedEncodeError(
                f"no chunk finished for {timeout:.0f}s; a rank may have died: "
                f"{_missing(chunks, seen)}. Rerun the same command to resume."
            )
        else:
            time.sleep(_POLL)


def _summary(
    parts: PartsFolder, chunks: Sequence[Chunk], plan: dict, info: RankInfo, **kw
) -> ChunkedSummary:
    totals = dict.fromkeys(("empty", "truncated", "tokens", "padded"), 0)
    for c in chunks:
        stats = parts.read_stats(c) or {}
        for k in totals:
            totals[k] += int(stats.get(k, 0))
    reused = set(plan["reused"])
    return ChunkedSummary(
        texts=sum(c.lines for c in chunks),
        world_size=info.world_size,
        chunks=len(chunks),
        computed=[c.index for c in chunks if c.index not in reused],
        reused=sorted(reused),
        computed_lines=sum(c.lines for c in chunks if c.index not in reused),
        rank_tokens=list(plan["rank_tokens"]),
        **totals,
        **kw,
    )


def encode_chunked(
    bert,
    texts: Sequence[str],
    *,
    parts: PartsFolder,
    identity: dict,
    encode_kwargs: dict,
    write: Callable[[np.ndarray], object],
    chunk_tokens: int | None = None,
    restart: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[int], Callable[[int], object]] | None = None,
    rank_info: RankInfo | None = None,
) -> ChunkedSummary | None:
    """Embed ``texts`` with ``bert`` through resumable chunks in ``parts``, on this rank of
    ``WORLD_SIZE`` (torchrun's environment; a single process without it).

    Rank 0 locks the parts folder (a second run on the same output is refused), plans (reusing
    the manifest when ``identity`` matches it), and at the end assembles every chunk in input
    order, calls ``write(embeddings)`` and removes the parts folder. ``encode_kwargs`` go to
    :meth:`Bert.encode_with_stats` (``pooling``, ``normalize``, ``batch_size``,
    ``max_length``). Returns the summary on rank 0, None on the others. ``progress(total)``
    (rank 0) returns a callback that takes the number of lines just finished, by any rank.
    """
    info = rank_info or RankInfo.from_env()
    started = time.perf_counter()
    joined = _init_group(info, timeout)
    lock = FolderLock(parts.path, what=str(parts.path)) if info.rank == 0 else None
    try:
        limit = int(encode_kwargs["max_length"])
        if info.rank == 0:
            try:
                parts.create()
                lock.acquire()  # type: ignore[union-attr]
                plan = _plan(
                    parts,
                    identity,
                    bert=bert,
                    texts=texts,
                    limit=limit,
                    chunk_tokens=chunk_tokens,
                    restart=restart,
                    world_size=info.world_size,
                )
            except BaseException as exc:
                _broadcast(f"rank 0 stopped the run: {exc}", info)
                raise
            _broadcast(plan, info)
        else:
            plan = _broadcast(None, info)  # type: ignore[assignment]
        if isinstance(plan, str):
            raise DistributedEncodeError(plan)
        if info.rank != 0 and not parts.manifest_path.is_file():
            raise DistributedEncodeError(
                f"rank {info.rank} cannot see {parts.manifest_path}, which rank 0 wrote: the "
                f"output folder must be on a filesystem shared by every node."
            )
        chunks = [Chunk.from_list(row) for row in plan["chunks"]]
        by_index = {c.index: c for c in chunks}
        mine = [by_index[i] for i in plan["assignment"][info.rank]]
        if info.rank == 0:
            logger.info(
                "%d lines in %d chunks (%d done before), %d rank(s); tokens per rank: %s",
                len(texts),
                len(chunks),
                len(plan["reused"]),
                info.world_size,
                ", ".join(map(str, plan["rank_tokens"])),
            )
        update = _progress(
            progress, info, chunks, set(plan["reused"]), set(plan["assignment"][0]), parts
        )
        try:
            _encode_chunks(bert, texts, mine, parts, info, encode_kwargs, update.own)
            _wait_for_parts(parts, chunks, timeout, update.others)
        except DistributedEncodeError:
            raise
        except BaseException as exc:  # a signal (a peer died and torchrun stops us), Ctrl-C
            if info.rank == 0:
                logger.warning(
                    "stopped (%s): %s", type(exc).__name__, _missing(chunks, parts.present(chunks))
                )
            raise
        _barrier(info)
        if info.rank != 0:
            return None
        width = bert.model.config.hidden_size
        write(parts.assemble(chunks, len(texts), width))
        summary = _summary(
            parts,
            chunks,
            plan,
            info,
            max_length=limit,
            width=width,
            seconds=time.perf_counter() - started,
        )
        parts.remove()
        return summary
    finally:
        if lock is not None:
            lock.release()
        if joined:
            import torch.distributed as dist

            dist.destroy_process_group()


class _Progress:
    """Rank 0's aggregated count: its own batches as they finish, other ranks' chunks as their
    parts appear (checked at most every 0.5 s)."""

    def __init__(self, bar, chunks, counted: set[int], own: set[int], parts: PartsFolder) -> None:
        self.bar, self.chunks, self.counted, self.own_chunks, self.parts = (
            bar,
            chunks,
            counted,
            own,
            parts,
        )
        self.lines = {c.index: c.lines for c in chunks}
        self.next_poll = 0.0

    def own(self, n: int) -> None:
        if self.bar is not None:
            self.bar(n)
            if time.monotonic() >= self.next_poll:
                self.next_poll = time.monotonic() + 0.5
                self.others(self.parts.present(self.chunks))

    def others(self, present: set[int]) -> None:
        new = present - self.counted - self.own_chunks
        self.counted |= new
        if self.bar is not None and new:
            self.bar(sum(self.lines[i] for i in new))


def _progress(progress, info, chunks, reused, own, parts) -> _Progress:
    bar = None
    if progress is not None and info.rank == 0:
        bar = progress(sum(c.lines for c in chunks))
        done = sum(c.lines for c in chunks if c.index in reused)
        if done:
            bar(done)
    return _Progress(bar, chunks, set(reused), own if info.rank == 0 else set(), parts)
