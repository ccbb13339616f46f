"""The chunk folder of a chunked encode: ``OUTPUT.parts/`` next to a file output (removed once
the output is written), or the output folder itself for a sharded output (``-o OUT/``).

Files:
    manifest.json           identity (inputs / model / settings) and the chunk list
    run.json                the latest run: world size, chunks reused
    claim-00012             chunk 12 is being computed (created with O_EXCL: exactly one rank
                            wins it; the claims of an earlier run are removed when a run starts)
    chunk-00012.npy         its embeddings, (rows, E) float32 (a shard)
    chunk-00012.json        its counts (rows, empty, truncated, tokens, padded, rank, ids,
                            skipped: the blank JSON lines it read, which gave no row) and
                            sha256: the digest of its input bytes; written after the .npy:
                            its presence means the chunk is finished
    held-chunk-00012.*      (only while ``--restart`` plans) a finished chunk of the old run set
                            aside: renamed to the new chunk whose input bytes have the same
                            sha256, or deleted; a run that starts removes any left over
    failed-rank1.json       rank 1 failed (which chunk, the problem, its fix): the others
                            stop; removed when the next run starts
    index.json              (sharded output) the shards in input order, written last:
                            :func:`bertattn.corpus.open_embeddings` reads it
Every file is written to a temporary name and renamed into place, so a crash at any moment
leaves only complete files (and ``.tmp`` leftovers, removed by the next run). ``.lock`` is the
lock the running job holds (:class:`bertattn.files.FolderLock`).

Everything in a chunk's ``.json`` but ``file`` / ``start`` / ``end`` is relative to the chunk's
own lines (its counts, ids, skipped lines, digest), so ``--restart`` moves a chunk whose input
bytes are unchanged to another index and byte range by rewriting only those three
(:meth:`ChunkStore.reuse_held`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..corpus.embeddings import FORMAT, INDEX, VERSION, Embeddings, npy_header
from ..errors import JobError
from ..files import FolderLock, write_atomic
from .plan import Chunk

__all__ = ["ChunkStore", "Piece"]

#: what encoding a chunk yields, block by block: (embeddings (n, E), counts, ids or None, bytes)
Piece = tuple[np.ndarray, dict, "list[object] | None", int]

_OURS = re.compile(
    r"(manifest\.json|run\.json|index\.json|claim-\d{5,}|chunk-\d{5,}\.(npy|json)|"
    r"held-chunk-\d{5,}\.(npy|json)|failed-rank\d+\.json|\..*\.tmp|\.lock)\Z"
)
_FINISHED = re.compile(r"chunk-\d{5,}\.json\Z")  # matched from the name's start: not held-
_HELD = "held-"
_COUNTS = ("rows", "empty", "truncated", "tokens", "padded")


def _write_json(path: Path, obj: object) -> None:
    write_atomic(path, json.dumps(obj, indent=1).encode() + b"\n")


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class ChunkStore:
    """The chunk folder at ``path``; ``sharded``: it is the output (kept, with an index),
    else a work folder removed once the output file is written."""

    def __init__(self, path: str | Path, *, sharded: bool = False) -> None:
        self.path = Path(path)
        self.sharded = sharded
        self.manifest_path = self.path / "manifest.json"
        self.run_path = self.path / "run.json"
        self.index_path = self.path / INDEX

    @classmethod
    def for_output(cls, output: str | Path, *, sharded: bool) -> ChunkStore:
        out = Path(output)
        return cls(out if sharded else out.with_name(out.name + ".parts"), sharded=sharded)

    def part(self, index: int) -> Path:
        return self.path / f"chunk-{index:05d}.npy"

    def stats_path(self, index: int) -> Path:
        return self.path / f"chunk-{index:05d}.json"

    def claim_path(self, index: int) -> Path:
        return self.path / f"claim-{index:05d}"

    def held_part(self, index: int) -> Path:
        """Where :meth:`hold` sets chunk ``index``'s ``.npy`` aside."""
        return self.path / (_HELD + self.part(index).name)

    def held_stats_path(self, index: int) -> Path:
        """Where :meth:`hold` sets chunk ``index``'s counts aside."""
        return self.path / (_HELD + self.stats_path(index).name)

    # ------------------------------------------------------------------ folder
    def exists(self) -> bool:
        return self.path.exists()

    def _check_ours(self) -> None:
        if not self.path.is_dir():
            raise ValueError(f"{self.path} exists and is not a folder; remove it.")
        foreign = sorted(p.name for p in self.path.iterdir() if not _OURS.match(p.name))
        if foreign:
            raise ValueError(
                f"{self.path} holds files bertattn did not write ({', '.join(foreign[:5])}); "
                f"it is not a bertattn chunk folder: move it away or choose another output."
            )

    def create(self) -> None:
        self.path.mkdir(exist_ok=True)
        self._check_ours()

    def remove(self) -> None:
        """Delete the folder and our files in it (refuses a folder holding other files)."""
        if not self.path.exists():
            return
        self._check_ours()
        for p in self.path.iterdir():
            p.unlink()
        self.path.rmdir()

    def clear(self, *, keep_held: bool = False) -> None:
        """Delete our files in the folder but keep the folder and its lock (``--restart``);
        ``keep_held``: keep the chunks set aside by :meth:`hold` too."""
        self._check_ours()
        for p in self.path.iterdir():
            if p.name == FolderLock.NAME or (keep_held and p.name.startswith(_HELD)):
                continue
            p.unlink()

    def start_run(self) -> None:
        """Before a run: no temporary files, claims, failures, held chunks or index of an
        earlier one."""
        for pattern in (".*.tmp", "claim-*", "failed-rank*.json", _HELD + "*"):
            for p in self.path.glob(pattern):
                p.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)

    def finish_run(self) -> None:
        """After a sharded run: only the shards, their counts, the manifest and the index."""
        for pattern in ("claim-*", "failed-rank*.json", "run.json"):
            for p in self.path.glob(pattern):
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ manifest / run
    def read_manifest(self) -> dict | None:
        """The manifest, or None when there is no folder (or an empty one)."""
        if not self.path.exists():
            return None
        self._check_ours()
        if not self.manifest_path.exists():
            return None
        manifest = _read_json(self.manifest_path)
        if manifest is None:
            raise ValueError(
                f"{self.manifest_path} is not valid JSON; pass --restart to discard {self.path}."
            )
        return manifest

    def write_manifest(self, manifest: dict) -> None:
        _write_json(self.manifest_path, manifest)

    def write_run(self, run: dict) -> None:
        _write_json(self.run_path, run)

    # ------------------------------------------------------------------ claims
    def claim(self, chunk: Chunk, rank: int) -> bool:
        """Take ``chunk`` for ``rank``; False when another rank has it already."""
        try:
            fd = os.open(self.claim_path(chunk.index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{rank} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        return True

    # ------------------------------------------------------------------ chunks
    def write_part(self, chunk: Chunk, pieces: Iterable[Piece], width: int, rank: int) -> dict:
        """Stream ``pieces`` into the chunk's ``.npy`` (its header rewritten with the final
        row count), then write its counts, the marker of a finished chunk. Returns them.
        ``chunk.sha256`` (the digest of its input bytes, when known) is recorded with them, so
        that ``--restart`` can keep the chunk when those bytes are unchanged."""
        counts = dict.fromkeys(_COUNTS, 0)
        ids: list[object] = []
        skipped: list[int] = []  # blank JSON lines, numbered from 1 at the chunk's first line
        with_ids = False

        def shard(f: BinaryIO) -> None:
            nonlocal with_ids
            f.write(npy_header(0, width))
            for emb, stats, piece_ids, _ in pieces:
                arr = np.ascontiguousarray(emb, dtype=np.float32)
                if arr.ndim != 2 or arr.shape[1] != width:
                    raise ValueError(
                        f"{chunk.describe()}: rows of shape {arr.shape}, not (n, {width})."
                    )
                f.write(arr.tobytes())
                counts["rows"] += arr.shape[0]
                for k in _COUNTS[1:]:
                    counts[k] += int(stats.get(k, 0))
                skipped.extend(stats.get("skipped", ()))
                if piece_ids is not None:
                    with_ids = True
                    ids.extend(piece_ids)
            f.seek(0)
            f.write(npy_header(counts["rows"], width))
            f.seek(0, os.SEEK_END)

        write_atomic(self.part(chunk.index), shard)
        record: dict[str, object] = {
            "file": chunk.file,
            "start": chunk.start,
            "end": chunk.end,
            **counts,
            "rank": rank,
        }
        if with_ids:
            record["ids"] = ids
        if skipped:
            record["skipped"] = skipped
        if chunk.sha256 is not None:
            record["sha256"] = chunk.sha256
        _write_json(self.stats_path(chunk.index), record)
        return record

    def read_stats(self, chunk: Chunk) -> dict | None:
        stats = _read_json(self.stats_path(chunk.index))
        if stats is None or [stats.get(k) for k in ("file", "start", "end")] != [
            chunk.file,
            chunk.start,
            chunk.end,
        ]:
            return None
        return stats

    def has_part(self, chunk: Chunk, width: int) -> bool:
        """A finished chunk: counts for this byte range and a ``(rows, width)`` float32 array."""
        return self.finished_stats(chunk, width) is not None

    def finished_stats(self, chunk: Chunk, width: int) -> dict | None:
        """The counts of ``chunk`` when it is finished (:meth:`has_part`), else None."""
        stats = self.read_stats(chunk)
        if stats is None or not self.part(chunk.index).is_file():
            return None
        try:
            arr = np.load(self.part(chunk.index), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return None
        if arr.dtype != np.float32 or arr.shape != (stats.get("rows"), width):
            return None
        return stats

    # ------------------------------------------------------------------ --restart keeps
    def hold(self, index: int) -> None:
        """Set finished chunk ``index`` aside (its counts first: a chunk without them is not
        finished), so that :meth:`clear` with ``keep_held`` keeps it."""
        os.replace(self.stats_path(index), self.held_stats_path(index))
        os.replace(self.part(index), self.held_part(index))

    def reuse_held(self, old: int, chunk: Chunk) -> None:
        """Make held chunk ``old`` the finished ``chunk`` (same input bytes, maybe at another
        index and offsets): its ``.npy`` renamed, its counts rewritten with ``chunk``'s
        ``file``, ``start`` and ``end`` (written last: the finished marker)."""
        stats = _read_json(self.held_stats_path(old))
        if stats is None:
            raise ValueError(f"{self.held_stats_path(old)} is missing or not valid JSON.")
        os.replace(self.held_part(old), self.part(chunk.index))
        stats.update(file=chunk.file, start=chunk.start, end=chunk.end)
        _write_json(self.stats_path(chunk.index), stats)
        self.held_stats_path(old).unlink()

    def drop_held(self) -> None:
        """Delete the held chunks that were not reused."""
        for p in self.path.glob(_HELD + "*"):
            p.unlink(missing_ok=True)

    def present(self, chunks: Sequence[Chunk]) -> set[int]:
        """Indices of chunks whose counts (the finished marker) exist (cheap: no validation)."""
        try:
            names = set(os.listdir(self.path))
        except FileNotFoundError:
            return set()
        return {c.index for c in chunks if self.stats_path(c.index).name in names}

    # ------------------------------------------------------------------ failures
    def mark_failed(self, rank: int, chunk: Chunk, error: str, **record: object) -> None:
        """Record that ``rank`` failed on ``chunk`` (``error``: the one-line message; ``record``:
        more fields, e.g. the problem and the fix apart, for whoever reports it)."""
        path = self.path / f"failed-rank{rank}.json"
        _write_json(
            path,
            {
                "rank": rank,
                "chunk": chunk.index,
                "what": chunk.describe(),
                "error": error,
                **record,
            },
        )

    def failures(self) -> list[dict]:
        return [f for p in sorted(self.path.glob("failed-rank*.json")) if (f := _read_json(p))]

    def forget_failures(self) -> None:
        """Remove the failure markers of an earlier run (the lock is held: that run is over)."""
        for p in self.path.glob("failed-rank*.json"):
            p.unlink(missing_ok=True)

    def finished_count(self) -> int:
        """How many chunks are finished (their counts exist), without the chunk list."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return 0
        return sum(1 for n in names if _FINISHED.match(n))

    # ------------------------------------------------------------------ the result
    def index(self, chunks: Sequence[Chunk], inputs: Sequence[str], width: int) -> dict:
        """The shards in input order (see :mod:`bertattn.corpus.embeddings`), from every
        chunk's counts; raises when a chunk is missing."""
        missing = [c for c in chunks if not self.has_part(c, width)]
        if missing:
            raise JobError(  # explained, so no traceback
                f"cannot finish: {len(missing)} chunk(s) missing or incomplete: "
                f"{', '.join(c.describe() for c in missing[:10])}; rerun the same command to "
                f"compute them."
            )
        shards, row, ids = [], 0, False
        line = [1] * len(inputs)  # next line number, per input file
        for c in chunks:
            stats = self.read_stats(c) or {}
            rows = int(stats["rows"])
            ids = ids or "ids" in stats
            shards.append(
                {
                    "file": self.part(c.index).name,
                    "rows": rows,
                    "first_row": row,
                    "input": c.file,
                    "first_line": line[c.file],
                    "bytes": [c.start, c.end],
                    "stats": self.stats_path(c.index).name,
                }
            )
            row += rows
            line[c.file] += rows + len(stats.get("skipped", ()))
        return {
            "format": FORMAT,
            "version": VERSION,
            "rows": row,
            "width": width,
            "dtype": "float32",
            "inputs": list(inputs),
            "ids": ids,
            "shards": shards,
        }

    def embeddings(self, index: dict) -> Embeddings:
        """The rows of ``index`` (from :meth:`index`), read from this folder's shards."""
        return Embeddings(self.path, index["shards"], int(index["width"]), index)

    def write_index(self, index: dict) -> None:
        _write_json(self.index_path, index)
