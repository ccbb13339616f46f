"""The parts folder next to the output (``OUTPUT.parts/``): the manifest, one ``.npy`` per
finished chunk (plus a small ``.json`` with its counts), failure markers, and the assembly of
the final output.

Files:
    manifest.json           identity (input / model / settings) and the chunk list
    run.json                the latest run's assignment of pending chunks to ranks
    chunk-00012.json        counts of chunk 12 (rows, tokens, padded, empty, truncated)
    chunk-00012.npy         its embeddings, (rows, E) float32; written last, so its presence
                            means the chunk is finished
    failed-rank1.json       rank 1 failed (which chunk, the error): the others stop
Every file is written to a temporary name and renamed into place, so a crash at any moment
leaves only complete files (and ``.tmp`` leftovers, removed by the next run). ``.lock`` is the
lock the running job holds (:class:`bertattn.files.FolderLock`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..files import FolderLock, write_atomic
from .plan import Chunk

__all__ = ["PartsFolder"]

_OURS = re.compile(
    r"(manifest\.json|run\.json|chunk-\d{5,}\.(npy|json)|failed-rank\d+\.json|\..*\.tmp|"
    r"\.lock)\Z"
)


def _write_json(path: Path, obj: object) -> None:
    write_atomic(path, json.dumps(obj, indent=1).encode() + b"\n")


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class PartsFolder:
    """``OUTPUT.parts/`` for ``output``; see the module docstring for its files."""

    def __init__(self, output: str | Path) -> None:
        out = Path(output)
        self.path = out.with_name(out.name + ".parts")
        self.manifest_path = self.path / "manifest.json"
        self.run_path = self.path / "run.json"

    def part(self, index: int) -> Path:
        return self.path / f"chunk-{index:05d}.npy"

    def stats_path(self, index: int) -> Path:
        return self.path / f"chunk-{index:05d}.json"

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
                f"it is not a parts folder: move it away or choose another output."
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

    def clear(self) -> None:
        """Delete our files in the folder but keep the folder and its lock (``--restart``)."""
        self._check_ours()
        for p in self.path.iterdir():
            if p.name != FolderLock.NAME:
                p.unlink()

    def clean_temp(self) -> None:
        for p in self.path.glob(".*.tmp"):
            p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ manifest / run
    def read_manifest(self) -> dict | None:
        """The manifest, or None when there is no parts folder (or an empty one)."""
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

    # ------------------------------------------------------------------ chunks
    def write_part(self, chunk: Chunk, emb: np.ndarray, stats: dict) -> None:
        """Counts first, then the embeddings (the marker of a finished chunk)."""
        if emb.shape[0] != chunk.lines:
            raise ValueError(f"{chunk.describe()}: {emb.shape[0]} rows for {chunk.lines} lines.")
        _write_json(self.stats_path(chunk.index), {"start": chunk.start, "end": chunk.end, **stats})
        arr = np.ascontiguousarray(emb, dtype=np.float32)
        write_atomic(self.part(chunk.index), lambda f: np.save(f, arr, allow_pickle=False))

    def read_stats(self, chunk: Chunk) -> dict | None:
        stats = _read_json(self.stats_path(chunk.index))
        if stats is None or stats.get("start") != chunk.start or stats.get("end") != chunk.end:
            return None
        return stats

    def has_part(self, chunk: Chunk, width: int) -> bool:
        """A finished chunk: counts for this line range and a ``(lines, width)`` float32 array."""
        if not self.part(chunk.index).is_file() or self.read_stats(chunk) is None:
            return False
        try:
            arr = np.load(self.part(chunk.index), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return False
        return arr.dtype == np.float32 and arr.shape == (chunk.lines, width)

    def present(self, chunks: Sequence[Chunk]) -> set[int]:
        """Indices of chunks whose ``.npy`` exists (cheap: no validation)."""
        try:
            names = set(os.listdir(self.path))
        except FileNotFoundError:
            return set()
        return {c.index for c in chunks if self.part(c.index).name in names}

    # ------------------------------------------------------------------ failures
    def mark_failed(self, rank: int, chunk: Chunk, error: str) -> None:
        path = self.path / f"failed-rank{rank}.json"
        _write_json(
            path, {"rank": rank, "chunk": chunk.index, "what": chunk.describe(), "error": error}
        )

    def failures(self) -> list[dict]:
        return [f for p in sorted(self.path.glob("failed-rank*.json")) if (f := _read_json(p))]

    def clear_failures(self) -> None:
        for p in self.path.glob("failed-rank*.json"):
            p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ assembly
    def assemble(self, chunks: Sequence[Chunk], lines: int, width: int) -> np.ndarray:
        """All chunks, in input order, as one ``(lines, width)`` array; every line exactly once
        (the chunks partition the lines, and each part has exactly its chunk's rows)."""
        from .plan import check_partition

        check_partition(chunks, lines)
        missing = [c for c in chunks if not self.has_part(c, width)]
        if missing:
            raise RuntimeError(
                f"cannot assemble: {len(missing)} chunk(s) missing or incomplete: "
                f"{', '.join(c.describe() for c in missing[:10])}; rerun the same command to "
                f"compute them."
            )
        out = np.empty((lines, width), dtype=np.float32)
        for c in chunks:
            out[c.start : c.end] = np.load(self.part(c.index), allow_pickle=False)
        return out
