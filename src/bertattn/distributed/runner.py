"""The chunked, resumable encode, on one rank of N (N = 1 works too).

Every rank runs :func:`run_chunks`. Rank 0 locks the chunk folder and plans: it reads the
manifest (a rerun) or cuts the input into byte-range chunks (O(chunks): a few bytes read per
cut, no pass over the lines), finds the finished chunks and broadcasts the plan. Then every rank
takes pending chunks one at a time (a claim file created with O_EXCL: exactly one rank gets each;
a rank that finishes early simply takes more), encodes each on its own device and writes it as a
shard. All ranks wait until every chunk is finished (polling the folder, so a slow rank is never
mistaken for a dead one: a run fails only when a rank reports a failure or no chunk finishes for
``timeout`` seconds); after a barrier rank 0 writes the index of a sharded output, or hands the
rows in input order to the caller's ``finish`` (a single output file) and removes the folder.

Each finished chunk records the sha256 of its input bytes. ``--restart`` keeps what it can: when
only the inputs changed (same parts format, model and settings), rank 0 sets the old finished
chunks aside, plans the new chunks as a fresh run does, and keeps every old chunk whose input
file path, size and sha256 equal a new chunk's (hashed again now: never trusted by offsets), at
that chunk's index and offsets; the rest is deleted. Chunk ends are found relative to each
chunk's start, so after fixing one line the chunks after it usually keep the same bytes at
shifted offsets, and are kept too. A store written without digests, or for another model,
settings or format, keeps nothing.

What a chunk is encoded with is the caller's ``work(chunk)``: the job reads the chunk's lines
and runs the model (:mod:`bertattn.jobs.encode`); the tests run a billion-line input with a
stub. The output equals a single-process encode up to float rounding (≤ 1e-6 here): batches are
formed within a chunk, so their padding differs from the whole-input batches.

A failure is said in one line, without exception class names, with its fix
(:func:`failure_message`): a bad input line (fix that line, then ``--restart``, which keeps the
chunks whose input did not change), a full disk (free space in the folder), another ``OSError``
(its strerror and path), anything else (rerun); and how many finished chunks are kept, when
there are some.

Test hooks (environment variables, read by every rank): ``BERTATTN_TEST_FAIL_CHUNK=3`` (or
``3,5``) makes encoding those chunks raise; ``BERTATTN_TEST_CHUNK_DELAY=0.5`` sleeps that many
seconds after each chunk is written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..corpus.embeddings import Embeddings
from ..corpus.sources import Source
from ..errors import disk_full, one_line
from ..files import FolderLock
from .group import Group, RankInfo, SoloGroup, TorchGroup
from .launch import REPORT_ENV
from .plan import (
    FORMAT_VERSION,
    Chunk,
    auto_chunk_bytes,
    check_identity,
    check_partition,
    chunk_sha256,
    make_chunks,
    sha256_files,
)
from .store import ChunkStore, Piece

logger = logging.getLogger("bertattn.distributed")

__all__ = [
    "ChunkFailed",
    "ChunkedSummary",
    "DistributedEncodeError",
    "RankInfo",
    "failure_message",
    "run_chunks",
    "run_identity",
]

DEFAULT_TIMEOUT = 1800.0
_POLL = 0.2

Work = Callable[[Chunk], Iterable[Piece]]
Progress = Callable[[int], Callable[[int], object]]


class DistributedEncodeError(RuntimeError):
    """A chunked run stopped: a rank failed, a peer vanished, or rank 0 refused the plan.

    ``echo``: this rank only repeats what another rank reported (that rank says it too)."""

    def __init__(self, message: str, *, echo: bool = False) -> None:
        super().__init__(message)
        self.echo = echo


class ChunkFailed(DistributedEncodeError):
    """Encoding a chunk raised (on this rank or, reported through the folder, another);
    ``record``: the failure as the folder records it (see :func:`failure_message`)."""

    def __init__(self, message: str, record: dict, *, echo: bool = False) -> None:
        super().__init__(message, echo=echo)
        self.record = record


# ---------------------------------------------------------------------- failure messages
def _failure_record(exc: BaseException, chunk: Chunk, rank: int, store: ChunkStore) -> dict:
    """What went wrong (``problem``) and what fixes it (``fix``: a sentence that the count of
    finished chunks completes, or "" when the problem names its own fix)."""
    text = one_line(exc)
    line = re.match(rf"{re.escape(chunk.name)}: line (\d+)\b", text) if chunk.name else None
    if disk_full(exc):
        kind, problem = "disk", text
        fix = f"Free disk space in {store.path}, then rerun the same command"
    elif isinstance(exc, OSError):
        kind, problem = "os", text
        fix = "Once that is fixed, rerun the same command"
    elif isinstance(exc, ValueError) and line:
        kind, problem = "input", text
        # an edited input no longer matches the run's manifest: --restart, which keeps the
        # finished chunks whose input bytes are unchanged
        fix = (
            f"Fix line {line.group(1)} of {chunk.name}, then rerun with --restart (only the "
            f"chunks whose input lines changed are encoded again)"
        )
    elif isinstance(exc, ValueError):  # names its own fix (e.g. --restart)
        kind, problem, fix = "value", f"rank {rank} failed on {chunk.describe()}: {text}", ""
    else:
        kind, problem = "error", f"rank {rank} failed on {chunk.describe()}: {text}"
        fix = "Rerun the same command"
    return {"kind": kind, "problem": problem, "fix": fix}


def failure_message(record: dict, finished: int, folder: Path | str) -> str:
    """One line from a failure ``record`` (a marker, see :func:`_failure_record`): the problem,
    the fix, and the ``finished`` chunks that are kept in ``folder`` (said only when some are)."""
    problem = str(record.get("problem") or "")
    if not problem:  # a marker of an older bertattn: rank, chunk, error
        problem = f"rank {record.get('rank')} failed on {record.get('what')}: {record.get('error')}"
    problem = problem.removesuffix(".")
    fix = str(record.get("fix", "Rerun the same command"))
    kept = ""
    if finished > 0:  # a fixed input too: --restart keeps the chunks it did not change
        kept = (
            f"the {finished} finished chunk{'s are' if finished != 1 else ' is'} kept in {folder}"
        )
    if fix and kept:
        return f"{problem}. {fix}: {kept}."
    if fix or kept:
        return f"{problem}. {fix or kept[0].upper() + kept[1:]}."
    return f"{problem}."


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
    rank_chunks: list[int] = field(default_factory=list)

    @property
    def padding_ratio(self) -> float:
        return 1.0 - self.tokens / self.padded if self.padded else 0.0

    def __str__(self) -> str:
        rate = self.computed_lines / self.seconds if self.seconds > 0 else float("inf")
        per_rank = ", ".join(map(str, self.rank_chunks))
        return (
            f"{self.texts} lines ({self.empty} empty, {self.truncated} truncated to "
            f"{self.max_length} tokens), {self.tokens} tokens, padding {self.padding_ratio:.1%} "
            f"({self.texts} x {self.width} float32) in {self.seconds:.1f}s, "
            f"{rate:.1f} sentences/s; {self.world_size} rank(s), {self.chunks} chunks: "
            f"{len(self.computed)} computed, {len(self.reused)} reused; chunks per rank: "
            f"{per_rank}"
        )


def run_identity(
    inputs: Sequence[dict], model_name: str, model_files: Sequence[Path], settings: dict
) -> dict:
    """What a manifest records so that a rerun resumes only the same work: the input files
    (:meth:`bertattn.corpus.InputFile.identity` each), the model (name, hash of its files)
    and the settings."""
    return {
        "format": FORMAT_VERSION,
        "inputs": list(inputs),
        "model": {"path": model_name, "sha256": sha256_files(model_files)},
        "settings": settings,
    }


# ---------------------------------------------------------------------- planning (rank 0)
def _plan(
    store: ChunkStore,
    identity: dict,
    files: Sequence[Source],
    *,
    chunk_bytes: int | None,
    restart: bool,
    width: int,
    world_size: int,
) -> dict:
    """Rank 0: the chunks (from the manifest when resuming) and which are done already.

    ``restart``: start over, but keep the finished chunks whose input bytes are unchanged
    (:func:`_hold_unchanged`, :func:`_reuse_held`)."""
    held: dict[tuple[str, int, str], list[int]] = {}
    if restart:
        store.drop_held()  # an interrupted --restart's: not known to be of this identity
        held = _hold_unchanged(store, identity, width)
        store.clear(keep_held=bool(held))
    manifest = store.read_manifest()
    names = [f.name for f in files]
    if manifest is not None:
        check_identity(manifest, identity, store.path, finished=store.index_path.is_file())
        chunks = [Chunk.from_list(row, names) for row in manifest.get("chunks", [])]
        check_partition(chunks, files)
    else:
        size = chunk_bytes or auto_chunk_bytes(sum(f.size for f in files))
        chunks = make_chunks(files, size)
        store.create()
        store.write_manifest(
            {**identity, "chunk_bytes": size, "chunks": [c.to_list() for c in chunks]}
        )
    if restart:
        kept = _reuse_held(store, held, chunks, files) if held else 0
        store.drop_held()  # what was not reused
        if held or kept:
            logger.info("%s", restart_kept(kept, kept + sum(len(v) for v in held.values())))
    store.start_run()
    done = [c.index for c in chunks if store.has_part(c, width)]
    store.write_run({"world_size": world_size, "reused": done, "started": time.time()})
    return {
        "chunks": [c.to_list() for c in chunks],
        "reused": done,
        "inputs": [[f.name, f.size] for f in files],
    }


def restart_kept(kept: int, finished: int) -> str:
    """What ``--restart`` did with the ``finished`` chunks of the earlier run: ``kept`` of them
    (their input bytes are unchanged), the others are encoded again (their bytes changed)."""
    head = f"--restart kept {kept} of {finished} finished chunk(s)"
    changed = finished - kept
    if changed == 0:
        return f"{head}: their input bytes are unchanged"
    if kept == 0:
        which = "its input bytes" if finished == 1 else f"the input bytes of all {finished}"
        them = "it is" if finished == 1 else "they are"
        return f"{head}: {which} changed, so {them} encoded again"
    return (
        f"{head}, whose input bytes are unchanged; {changed} "
        f"{'is' if changed == 1 else 'are'} encoded again: "
        f"{'its' if changed == 1 else 'their'} input bytes changed"
    )


def _same_work(old: dict, new: dict) -> bool:
    """The manifest ``old`` and this run's identity ``new`` have the same parts format, model
    and settings (the inputs may differ): their chunks' rows are interchangeable."""
    o_model, n_model = old.get("model"), new.get("model")
    return (
        old.get("format") == new.get("format")
        and isinstance(o_model, dict)
        and isinstance(n_model, dict)
        and o_model.get("sha256") == n_model.get("sha256")
        and old.get("settings") == new.get("settings")
    )


def _input_paths(inputs: object) -> list[str | None]:
    """The ``path`` of each input of an identity (None where it has none)."""
    if not isinstance(inputs, list):
        return []
    return [str(f["path"]) if isinstance(f, dict) and "path" in f else None for f in inputs]


_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


def _hold_unchanged(
    store: ChunkStore, identity: dict, width: int
) -> dict[tuple[str, int, str], list[int]]:
    """``--restart``, before clearing: set aside (:meth:`ChunkStore.hold`) the finished chunks
    of the old run that a chunk of this one may reuse: the old manifest has this run's format,
    model and settings, and the chunk is finished (:meth:`ChunkStore.has_part`) with a
    ``sha256``. Returns ``{(input path, size, sha256): [old indices]}``; empty when nothing can
    be kept (another identity, a store of an older bertattn, an unreadable manifest)."""
    try:
        old = store.read_manifest()
    except ValueError:  # not valid JSON: --restart discards it
        return {}
    if old is None or not _same_work(old, identity):
        return {}
    paths = _input_paths(old.get("inputs"))
    held: dict[tuple[str, int, str], list[int]] = {}
    for row in old.get("chunks", []) if isinstance(old.get("chunks"), list) else []:
        try:
            chunk = Chunk.from_list(row)
        except (TypeError, ValueError):
            continue
        path = paths[chunk.file] if 0 <= chunk.file < len(paths) else None
        stats = None if path is None or chunk.size <= 0 else store.finished_stats(chunk, width)
        if stats is None:
            continue
        digest = stats.get("sha256")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            continue
        store.hold(chunk.index)
        held.setdefault((path, chunk.size, digest), []).append(chunk.index)
    return held


def _reuse_held(
    store: ChunkStore,
    held: dict[tuple[str, int, str], list[int]],
    chunks: Sequence[Chunk],
    files: Sequence[Source],
) -> int:
    """``--restart``, after planning: every new chunk whose input path and size equal a held
    chunk's is hashed; when the sha256 is equal too, the held chunk becomes it
    (:meth:`ChunkStore.reuse_held`; each held chunk once). Takes the reused chunks out of
    ``held``; returns how many."""
    sizes = {(path, size) for path, size, _ in held}
    candidates = []
    for chunk in chunks:
        path = files[chunk.file].name  # the path the identity records for it
        if (path, chunk.size) in sizes:
            candidates.append((path, chunk))
    # reading and hashing release the GIL: a few threads hash a large corpus faster
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda pc: chunk_sha256(files[pc[1].file], pc[1]), candidates))
    kept = 0
    for (path, chunk), digest in zip(candidates, digests, strict=True):
        olds = held.get((path, chunk.size, digest))
        if olds:
            store.reuse_held(olds.pop(0), chunk)
            kept += 1
    return kept


# ---------------------------------------------------------------------- encoding (each rank)
def _test_hooks() -> tuple[set[int], float]:
    fail = {int(x) for x in os.environ.get("BERTATTN_TEST_FAIL_CHUNK", "").split(",") if x.strip()}
    delay = float(os.environ.get("BERTATTN_TEST_CHUNK_DELAY", "0") or 0)
    return fail, delay


def _counted(pieces: Iterable[Piece], add: Callable[[int], object]) -> Iterator[Piece]:
    for piece in pieces:
        yield piece
        if piece[3]:
            add(piece[3])


def _encode_chunks(
    store: ChunkStore,
    chunks: Sequence[Chunk],
    reused: set[int],
    work: Work,
    width: int,
    rank: int,
    update: _Progress,
    digest: Callable[[Chunk], str] | None = None,
) -> None:
    """Take pending chunks one at a time, in input order, until none is left. ``digest(chunk)``:
    the sha256 of its input bytes, computed before encoding it and recorded with it."""
    fail, delay = _test_hooks()
    for chunk in chunks:
        if chunk.index in reused:
            continue
        if store.failures():  # another rank failed: take no more (the wait reports it)
            return
        if not store.claim(chunk, rank):
            continue
        update.mine.add(chunk.index)
        done = [0]

        def add(n: int, done: list[int] = done) -> None:
            done[0] += n
            update.own(n)

        try:
            if chunk.index in fail:
                raise RuntimeError(f"injected failure (BERTATTN_TEST_FAIL_CHUNK={chunk.index})")
            # the digest of its input bytes, recorded with it: what --restart compares
            hashed = chunk if digest is None else dataclasses.replace(chunk, sha256=digest(chunk))
            pieces = work(hashed) if digest is None else _same_bytes(work(hashed), hashed, digest)
            store.write_part(hashed, _counted(pieces, add), width, rank)
        except Exception as exc:
            record = _failure_record(exc, chunk, rank, store)
            message = failure_message(record, len(store.present(chunks)), store.path)
            try:  # the other ranks stop when they see it
                store.mark_failed(rank, chunk, message, **record)
            except OSError:  # a full disk may refuse even that: torchrun stops them
                pass
            raise ChunkFailed(message, {"rank": rank, **record}) from exc
        update.own(chunk.size - done[0])  # a compressed chunk is counted at its end
        if delay:
            time.sleep(delay)


def _same_bytes(
    pieces: Iterable[Piece], chunk: Chunk, digest: Callable[[Chunk], str]
) -> Iterator[Piece]:
    """``pieces``, then a check that the chunk's input bytes still have the digest taken
    before they were read (``chunk.sha256``): raises ``ValueError`` before the chunk is
    finished when the file changed while it was read, as its rows may then be of other bytes
    than the digest it would be recorded with, which ``--restart`` trusts to keep it."""
    yield from pieces
    if digest(chunk) != chunk.sha256:
        raise ValueError(
            f"{chunk.name or f'file {chunk.file}'} changed while the chunk was read (its bytes' "
            f"sha256 differs from before): its rows are not kept. Let the input be, then rerun "
            f"with --restart"
        )


def _missing(chunks: Sequence[Chunk], present: set[int]) -> str:
    gone = [c.index for c in chunks if c.index not in present]
    shown = ", ".join(map(str, gone[:20])) + (" ..." if len(gone) > 20 else "")
    return f"{len(gone)} chunk(s) not written: {shown}"


def _wait_for_chunks(
    store: ChunkStore, chunks: Sequence[Chunk], timeout: float, update: _Progress, poll: float
) -> None:
    """Until every chunk is finished; fail on a failure marker or ``timeout`` seconds without a
    newly finished chunk."""
    seen = store.present(chunks)
    last = time.monotonic()
    while len(seen) < len(chunks):
        failures = store.failures()
        if failures:
            f = failures[0]
            finished = len(store.present(chunks))
            raise ChunkFailed(failure_message(f, finished, store.path), f, echo=True)
        now = store.present(chunks)
        if now - seen:
            update.others(now)
            seen |= now
            last = time.monotonic()
        elif time.monotonic() - last > timeout:
            raise DistributedEncodeError(
                f"no chunk finished for {timeout:.0f}s; a rank may have died: "
                f"{_missing(chunks, seen)}. Rerun the same command to resume."
            )
        else:
            time.sleep(poll)


def _summary(
    store: ChunkStore, chunks: Sequence[Chunk], reused: set[int], world_size: int, **kw: object
) -> ChunkedSummary:
    totals = dict.fromkeys(("texts", "empty", "truncated", "tokens", "padded"), 0)
    per_rank = [0] * world_size
    computed_lines = 0
    for c in chunks:
        stats = store.read_stats(c) or {}
        totals["texts"] += int(stats.get("rows", 0))
        for k in ("empty", "truncated", "tokens", "padded"):
            totals[k] += int(stats.get(k, 0))
        if c.index not in reused:
            computed_lines += int(stats.get("rows", 0))
            rank = int(stats.get("rank", 0))
            if 0 <= rank < world_size:
                per_rank[rank] += 1
    return ChunkedSummary(
        world_size=world_size,
        chunks=len(chunks),
        computed=[c.index for c in chunks if c.index not in reused],
        reused=sorted(reused),
        computed_lines=computed_lines,
        rank_chunks=per_rank,
        **totals,
        **kw,  # type: ignore[arg-type]
    )


def run_chunks(
    *,
    store: ChunkStore,
    files: Sequence[Source],
    identity: dict,
    work: Work,
    width: int,
    finish: Callable[[Embeddings], object] | None = None,
    chunk_bytes: int | None = None,
    restart: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
    group: Group | None = None,
    max_length: int = 0,
    poll: float = _POLL,
    digests: bool = True,
    check_inputs: Callable[[], None] | None = None,
) -> ChunkedSummary | None:
    """Encode ``files`` chunk by chunk with ``work`` into ``store``, as this rank of the run.

    ``group``: the ranks (default: torchrun's, or this process alone). Rank 0 locks the
    folder (a second run on the same output is refused), plans (reusing the manifest when
    ``identity`` matches it; chunks of ``chunk_bytes``, default :func:`.auto_chunk_bytes`)
    and at the end writes the index of a sharded store, or calls ``finish(rows)`` with every
    row in input order and removes the folder. ``work(chunk)`` yields the chunk's
    :data:`~bertattn.distributed.store.Piece` s. Returns the summary on rank 0, None on the
    others. ``progress(total_bytes)`` (rank 0) returns a callback that takes a number of input
    bytes just finished, by any rank. ``digests``: record the sha256 of each chunk's input
    bytes (read once more before encoding it), which ``--restart`` needs to keep it; False for
    a stand-in source whose bytes are costly to read (the tests' virtual corpus): ``restart``
    then keeps none of its chunks.
    ``check_inputs()`` (rank 0, once every chunk is finished, before the index or ``finish``):
    raises when an input changed during the run, whose rows then may mix old and new content;
    the finished chunks stay in the folder.
    """
    started = time.perf_counter()
    owned = group is None
    group = _default_group(timeout) if group is None else group
    lock = FolderLock(store.path, what=str(store.path)) if group.rank == 0 else None
    finished = False
    try:
        args = (store, files, identity, group, lock, chunk_bytes, restart, width)
        names, chunks, reused = _agree_on_plan(*args)
        rank = group.rank
        update = _Progress.start(progress if rank == 0 else None, chunks, reused, store)
        digest = (lambda c: chunk_sha256(files[c.file], c)) if digests else None
        try:
            _encode_chunks(store, chunks, reused, work, width, rank, update, digest=digest)
            _wait_for_chunks(store, chunks, timeout, update, poll)
        except DistributedEncodeError:
            raise
        except BaseException as exc:  # a signal (a peer died and torchrun stops us), Ctrl-C
            if rank == 0 and not os.environ.get(REPORT_ENV):  # --workers: its launcher says
                _log_stop(exc, chunks, store)
            raise
        group.barrier()
        if group.rank != 0:
            return None
        summary = _finish_run(
            store,
            chunks,
            reused,
            names,
            finish,
            check_inputs,
            world_size=group.world_size,
            max_length=max_length,
            width=width,
            started=started,
        )
        finished = True
        return summary
    finally:
        if lock is not None:  # a finished folder keeps no .lock; an unfinished one keeps it
            lock.release(remove=finished)
        if owned:
            group.close()


def _agree_on_plan(
    store: ChunkStore,
    files: Sequence[Source],
    identity: dict,
    group: Group,
    lock: FolderLock | None,
    chunk_bytes: int | None,
    restart: bool,
    width: int,
) -> tuple[list[str], list[Chunk], set[int]]:
    """The run's plan, made by rank 0 (which creates and locks the folder, and logs the plan)
    and broadcast to every rank, each of which checks that it sees the manifest and the same
    input files. Returns the inputs' names, the chunks and those kept from an earlier run."""
    if group.rank == 0:
        try:
            store.create()
            lock.acquire()  # type: ignore[union-attr]
            store.forget_failures()  # an earlier run's: reported by that run already
            plan: object = _plan(
                store,
                identity,
                files,
                chunk_bytes=chunk_bytes,
                restart=restart,
                width=width,
                world_size=group.world_size,
            )
        except BaseException as exc:
            group.broadcast(f"rank 0 stopped the run: {one_line(exc)}")
            raise
        group.broadcast(plan)
    else:
        plan = group.broadcast(None)
    if isinstance(plan, str):
        raise DistributedEncodeError(plan, echo=True)  # rank 0 reports it
    if group.rank != 0 and not store.manifest_path.is_file():
        raise DistributedEncodeError(
            f"rank {group.rank} cannot see {store.manifest_path}, which rank 0 wrote: the "
            f"output folder must be on a filesystem shared by every node."
        )
    _check_same_inputs(plan, files, group.rank)  # type: ignore[arg-type]
    names = [f.name for f in files]
    chunks = [Chunk.from_list(row, names) for row in plan["chunks"]]  # type: ignore[index]
    reused = set(plan["reused"])  # type: ignore[index]
    if group.rank == 0:
        _log_plan(files, chunks, reused, group.world_size)
    return names, chunks, reused


def _default_group(timeout: float) -> Group:
    """torchrun's ranks (through torch.distributed) when its environment has several, else
    this process alone."""
    info = RankInfo.from_env()
    return TorchGroup(info, timeout) if info.world_size > 1 else SoloGroup()


def _log_stop(exc: BaseException, chunks: list[Chunk], store: ChunkStore) -> None:
    """Rank 0 was stopped: why, and the chunks still missing."""
    logger.warning("stopped (%s): %s", type(exc).__name__, _missing(chunks, store.present(chunks)))


def _log_plan(files: Sequence[Source], chunks: list[Chunk], reused: set, ranks: int) -> None:
    logger.info(
        "%d file(s), %d bytes in %d chunks (%d done before), %d rank(s)",
        len(files),
        sum(f.size for f in files),
        len(chunks),
        len(reused),
        ranks,
    )


def _check_same_inputs(plan: dict, files: Sequence[Source], rank: int) -> None:
    """This rank sees the input files (names and sizes) the plan of rank 0 lists."""
    mine = [[f.name, f.size] for f in files]
    if plan["inputs"] != mine:  # type: ignore[index]
        theirs = plan["inputs"]  # type: ignore[index]
        first = next(
            (i for i, (a, b) in enumerate(zip(theirs, mine, strict=False)) if a != b),
            min(len(theirs), len(mine)),
        )
        raise DistributedEncodeError(
            f"rank {rank} sees other input files than rank 0 ({len(mine)} file(s) vs "
            f"{len(theirs)}; first difference at file {first + 1}: "
            f"{mine[first] if first < len(mine) else 'none'} vs "
            f"{theirs[first] if first < len(theirs) else 'none'}): every node must see the "
            f"same files at the same paths."
        )


def _finish_run(
    store: ChunkStore,
    chunks: list[Chunk],
    reused: set,
    names: list[str],
    finish: Callable[[Embeddings], object] | None,
    check_inputs: Callable[[], None] | None,
    *,
    world_size: int,
    max_length: int,
    width: int,
    started: float,
) -> ChunkedSummary:
    """Rank 0, every chunk finished: the inputs checked unchanged, the index written (a sharded
    store) or ``finish`` given every row, the summary made, a plain store's folder removed."""
    if check_inputs is not None:
        check_inputs()
    index = store.index(chunks, names, width)
    if store.sharded:
        store.finish_run()
        store.write_index(index)
    elif finish is not None:
        finish(store.embeddings(index))
    summary = _summary(
        store,
        chunks,
        reused,
        world_size,
        max_length=max_length,
        width=width,
        seconds=time.perf_counter() - started,
    )
    if not store.sharded:
        store.remove()
    return summary


class _Progress:
    """Rank 0's count of input bytes: its own pieces as they finish, other ranks' chunks as they
    appear (checked at most every 0.5 s)."""

    def __init__(self, bar: Callable[[int], object] | None, chunks, counted, store) -> None:  # type: ignore[no-untyped-def]
        self.bar, self.store, self.chunks = bar, store, chunks
        self.counted: set[int] = set(counted)
        self.mine: set[int] = set()
        self.sizes = {c.index: c.size for c in chunks}
        self.next_poll = 0.0

    @classmethod
    def start(cls, progress, chunks, reused, store) -> _Progress:  # type: ignore[no-untyped-def]
        bar = None
        if progress is not None:
            bar = progress(sum(c.size for c in chunks))
            done = sum(c.size for c in chunks if c.index in reused)
            if done:
                bar(done)
        return cls(bar, chunks, reused, store)

    def own(self, n: int) -> None:
        if self.bar is None:
            return
        if n:
            self.bar(n)
        if time.monotonic() >= self.next_poll:
            self.next_poll = time.monotonic() + 0.5
            self.others(self.store.present(self.chunks))

    def others(self, present: set[int]) -> None:
        new = present - self.counted - self.mine
        self.counted |= new
        if self.bar is not None and new:
            self.bar(sum(self.sizes[i] for i in new))
