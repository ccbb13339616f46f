"""Reading embeddings back: one ``.npy`` file, or a sharded output folder, as rows in input order.

A sharded folder (``bertattn encode CORPUS -o OUT/``) holds one ``chunk-NNNNN.npy`` per chunk of
the input, each ``(rows, width)`` float32, and ``index.json``, written last, which maps the
shards to the input::

    {"format": "bertattn-embeddings", "version": 1, "rows": N, "width": W, "dtype": "float32",
     "inputs": ["corpus/part-0.jsonl.gz", ...],
     "shards": [{"file": "chunk-00000.npy", "rows": 2731, "first_row": 0,
                 "input": 0, "first_line": 1, "bytes": [0, 1048601], "stats": "chunk-00000.json"},
                ...]}

``first_row`` is the shard's first row in the whole output, ``input`` / ``first_line`` the file
(an index into ``inputs``) and the 1-based line in it where the shard starts, ``bytes`` the
shard's byte range of that file (a compressed file is one shard: its whole stored size). A
JSON-lines input has one row per record, not per line (its blank lines are skipped): a shard's
stats file (``chunk-NNNNN.json``) may list them as ``"skipped"``, line numbers counted from 1 at
the shard's first line, which :meth:`Embeddings.locate` takes into account. Any tool can read
the shards with ``numpy.load``; :func:`open_embeddings` does it for you.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["INDEX", "Embeddings", "npy_header", "open_embeddings"]

INDEX = "index.json"
FORMAT = "bertattn-embeddings"
VERSION = 1
NPY_HEADER_BYTES = 128


def npy_header(rows: int, width: int) -> bytes:
    """A ``.npy`` (format 1.0) header for a C-order float32 ``(rows, width)`` array, always
    ``NPY_HEADER_BYTES`` long: a writer can put it first with a guess and rewrite it in place
    once the row count is known."""
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {width}), }}"
    room = NPY_HEADER_BYTES - 10
    if len(text) + 1 > room:
        raise ValueError(f"shape ({rows}, {width}) does not fit a {NPY_HEADER_BYTES}-byte header.")
    body = (text + " " * (room - len(text) - 1) + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class Embeddings:
    """Rows of embeddings in input order, read on demand from one or more ``.npy`` shards
    (memory-mapped: opening costs no reading). ``emb[i]``, ``emb[a:b]``, ``emb[[i, j]]`` return
    NumPy arrays; ``len(emb)``, ``emb.shape``; ``np.asarray(emb)`` reads everything;
    :meth:`shards` walks the shards in order; :meth:`locate` says which input line a row came
    from (sharded folders)."""

    def __init__(self, path: Path, shards: list[dict[str, Any]], width: int, index: dict | None):
        self.path = path
        self.index = index
        self.width = width
        self._shards = shards
        self._starts = [int(s["first_row"]) for s in shards]
        self._rows = sum(int(s["rows"]) for s in shards)
        self._maps: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ shape
    @property
    def shape(self) -> tuple[int, int]:
        return (self._rows, self.width)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __len__(self) -> int:
        return self._rows

    def __repr__(self) -> str:
        return f"Embeddings({str(self.path)!r}, shape={self.shape}, shards={len(self._shards)})"

    # ------------------------------------------------------------------ shards
    def _shard(self, k: int) -> np.ndarray:
        arr = self._maps.get(k)
        if arr is None:
            info = self._shards[k]
            file = self.path / info["file"] if self.path.is_dir() else self.path
            arr = np.load(file, mmap_mode="r", allow_pickle=False)
            if arr.dtype != np.float32 or arr.shape != (int(info["rows"]), self.width):
                raise ValueError(
                    f"{file} holds a {arr.dtype} array of shape {arr.shape}; the index says "
                    f"({info['rows']}, {self.width}) float32: the folder is damaged or was "
                    f"changed after the run."
                )
            self._maps[k] = arr
        return arr

    def shards(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, rows)`` per shard, in order (``rows`` memory-mapped, read-only)."""
        for k, start in enumerate(self._starts):
            yield start, self._shard(k)

    # ------------------------------------------------------------------ rows
    def _row(self, i: int) -> np.ndarray:
        if not -self._rows <= i < self._rows:
            raise IndexError(f"row {i} is out of range for {self._rows} rows.")
        i %= self._rows
        k = bisect.bisect_right(self._starts, i) - 1
        return np.array(self._shard(k)[i - self._starts[k]])

    def _rows_of(self, idx: np.ndarray) -> np.ndarray:
        if idx.size and (idx.min() < -self._rows or idx.max() >= self._rows):
            raise IndexError(f"a row index is out of range for {self._rows} rows.")
        idx = idx % max(self._rows, 1)
        out = np.empty((idx.size, self.width), dtype=np.float32)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        for k in np.unique(which):
            sel = which == k
            out[sel] = self._shard(int(k))[idx[sel] - self._starts[k]]
        return out

    def __getitem__(self, key: object) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            return self._row(int(key))
        if isinstance(key, slice):
            return self._rows_of(np.arange(self._rows)[key])
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (self._rows,):
                raise IndexError(f"a boolean index must have {self._rows} entries.")
            idx = np.flatnonzero(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"rows are indexed by int, slice or integer array, got {key!r}.")
        return self._rows_of(idx.reshape(-1)).reshape(*idx.shape, self.width)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def to_numpy(self) -> np.ndarray:
        """All rows in memory, ``(rows, width)`` float32."""
        out = np.empty(self.shape, dtype=np.float32)
        for start, rows in self.shards():
            out[start : start + len(rows)] = rows
        return out

    # ------------------------------------------------------------------ provenance
    def locate(self, row: int) -> tuple[str, int]:
        """``(input file, 1-based line)`` that row ``row`` was computed from (a sharded folder:
        lines are counted per file)."""
        if self.index is None:
            return str(self.path), int(row) + 1
        if not 0 <= row < self._rows:
            raise IndexError(f"row {row} is out of range for {self._rows} rows.")
        k = bisect.bisect_right(self._starts, row) - 1
        info = self._shards[k]
        line = row - self._starts[k] + 1  # within the shard, blank JSON lines not yet counted
        for blank in self._skipped(info):
            if blank > line:
                break
            line += 1
        return self.index["inputs"][info["input"]], int(info["first_line"]) + line - 1

    def _skipped(self, info: dict[str, Any]) -> list[int]:
        """The blank JSON lines a shard skipped (its stats' ``"skipped"``), sorted."""
        if "stats" not in info or not self.path.is_dir():
            return []
        try:
            stats = json.loads((self.path / info["stats"]).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in stats.get("skipped", ()))

    def ids(self) -> list[object] | None:
        """Each row's id (``--id-field``), in order; None when the run recorded none."""
        if self.index is None or not self.index.get("ids"):
            return None
        out: list[object] = []
        for info in self._shards:
            stats = json.loads((self.path / info["stats"]).read_text(encoding="utf-8"))
            out += stats["ids"]
        return out


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"{path} is not a bertattn embeddings folder: {why}.")


def open_embeddings(path: str | os.PathLike[str]) -> Embeddings:
    """The embeddings at ``path``: a ``.npy`` file (``(rows, width)`` float32) or a folder
    written by ``bertattn encode ... -o FOLDER/`` (its ``index.json``), rows in input order,
    memory-mapped. Raises ``ValueError`` for a folder without a complete index (a run still
    going, or interrupted: rerun it to finish) and ``FileNotFoundError`` for a missing path."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist.")
    if p.is_file():
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
        if arr.ndim != 2 or arr.dtype != np.float32:
            raise ValueError(
                f"{p} holds a {arr.dtype} array of shape {arr.shape}, not (N, E) float32."
            )
        emb = Embeddings(
            p, [{"file": p.name, "rows": arr.shape[0], "first_row": 0}], arr.shape[1], None
        )
        emb._maps[0] = arr
        return emb
    index_path = p / INDEX
    if not index_path.is_file():
        raise _bad(p, f"no {INDEX} (the run that writes it has not finished: rerun it to finish)")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _bad(p, f"{INDEX} cannot be read ({exc})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _bad(p, f"{INDEX} is not a {FORMAT} index")
    if index.get("version") != VERSION:
        raise _bad(
            p, f"{INDEX} has version {index.get('version')!r}; this bertattn reads {VERSION}"
        )
    shards = index["shards"]
    row = 0
    for s in shards:
        if int(s["first_row"]) != row:
            raise _bad(p, f"{INDEX}: shard {s['file']} starts at row {s['first_row']}, not {row}")
        row += int(s["rows"])
    if row != int(index["rows"]):
        raise _bad(p, f"{INDEX}: the shards hold {row} rows, the index says {index['rows']}")
    return Embeddings(p, shards, int(index["width"]), index)
