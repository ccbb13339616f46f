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
import operator
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import ArgumentTypeError, describe
from ..errors import one_line
from .checks import INDEX, damaged, npy_layout, read_stats, shard_list

__all__ = ["INDEX", "Embeddings", "npy_header", "open_embeddings"]

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
    (memory-mapped: opening costs no reading). ``emb[key]`` is ``np.asarray(emb)[key]``
    (``emb[i]``, ``emb[a:b]``, ``emb[[i, j]]``, ``emb[i, j]``, ``emb[mask, :10]``, ...), reading
    only the rows ``key`` selects; ``len(emb)``, ``emb.shape``; ``np.asarray(emb)`` reads
    everything; :meth:`shards` walks the shards in order; :meth:`locate` says which input line
    a row came from (sharded folders)."""

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
            try:
                arr = np.load(file, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:  # changed since it was opened
                raise damaged(self.path, f"{file} cannot be read ({one_line(exc)})") from None
            if arr.dtype != np.float32 or arr.shape != (int(info["rows"]), self.width):
                raise damaged(
                    self.path,
                    f"{file} holds a {arr.dtype} array of shape {arr.shape}; the index says "
                    f"({info['rows']}, {self.width}) float32",
                )
            self._maps[k] = arr
        return arr

    def shards(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, rows)`` per shard, in order (``rows`` memory-mapped, read-only)."""
        for k, start in enumerate(self._starts):
            yield start, self._shard(k)

    # ------------------------------------------------------------------ rows
    def _rows_of(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (1-D, each in ``0 <= i < rows``), in that order, as one array."""
        out = np.empty((idx.size, self.width), dtype=np.float32)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        for k in np.unique(which):
            sel = which == k
            out[sel] = self._shard(int(k))[idx[sel] - self._starts[k]]
        return out

    def __getitem__(self, key: object) -> np.ndarray:
        """What ``np.asarray(self)[key]`` gives, reading only the rows ``key`` selects: an int
        (NumPy integers too), a slice, an integer array or list, a boolean mask, a tuple of
        those for (rows, columns), ``...``, and ``None`` (``np.newaxis``: a new axis of length
        1, where NumPy puts it), and a bare ``True`` / ``False`` (an axis of length 1 / 0 in
        front, as NumPy). A bool inside a tuple raises ``TypeError``; what NumPy refuses as an
        index (a float, a string, a set) and an index out of range raise ``IndexError``."""
        if isinstance(key, (bool, np.bool_)):
            return self[None] if key else np.empty((0, *self.shape), dtype=np.float32)
        entries = _normalized_key(key, self.shape)
        at = next(i for i, e in enumerate(entries) if e is not None)  # the row entry
        rows, row_key = _row_selection(entries[at], self._rows)
        rest = tuple(entries[at + 1 :])
        if at:  # new axes before the rows: NumPy places them, on the rows read
            return self._rows_of(rows)[(*entries[:at], row_key, *rest)]
        plain = all(e is not None for e in rest)
        if isinstance(row_key, slice) and rows.size and plain:  # rows first: shard by shard
            # each part copied out of its shard's rows, which are then let go
            parts = [self._rows_of(run)[(row_key, *rest)].copy() for run in self._runs(rows)]
            return np.concatenate(parts)
        return self._rows_of(rows)[(row_key, *rest)]

    def _runs(self, rows: np.ndarray) -> list[np.ndarray]:
        """``rows`` cut where they pass from one shard to another (each piece in one shard), so
        that ``emb[:, 0]`` holds one shard's rows at a time, not every row."""
        which = np.searchsorted(self._starts, rows, side="right")
        return np.split(rows, np.flatnonzero(np.diff(which)) + 1)

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
        lines are counted per file). A negative ``row`` counts from the end, as in NumPy; one
        out of range raises ``IndexError``."""
        row = _row_number(row, self._rows)
        if self.index is None:
            return str(self.path), row + 1
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
        stats = read_stats(self.path, info["stats"], f"the stats file of {info['file']}")
        skipped = stats.get("skipped", [])
        if not isinstance(skipped, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in skipped
        ):
            raise damaged(
                self.path, f"{self.path / info['stats']}: 'skipped' is not a list of line numbers"
            )
        return sorted(skipped)

    def ids(self) -> list[object] | None:
        """Each row's id (``--id-field``), in order; None when the run recorded none."""
        if self.index is None or not self.index.get("ids"):
            return None
        out: list[object] = []
        for info in self._shards:
            stats = read_stats(self.path, info.get("stats"), f"the stats file of {info['file']}")
            ids = stats.get("ids")
            if not isinstance(ids, list) or len(ids) != int(info["rows"]):
                raise damaged(
                    self.path,
                    f"{self.path / info['stats']}: 'ids' is not a list of {info['rows']} ids, "
                    f"one per row of {info['file']}",
                )
            out += ids
        return out


# ---------------------------------------------------------------------- indexing
_KEY_FORMS = (
    "an int, a slice, an integer array or list, a boolean mask, ..., None or a tuple of those "
    "(rows, columns)"
)


def _row_number(row: object, rows: int) -> int:
    """``row`` as a row number in ``0 <= row < rows`` (negative: from the end, as in NumPy)."""
    if isinstance(row, (bool, np.bool_)) or not hasattr(row, "__index__"):
        raise TypeError(f"a row number must be an int, got {row!r}.")
    i = operator.index(row)  # type: ignore[arg-type]
    if not -rows <= i < rows:
        raise IndexError(f"row {i} is out of range for {rows} rows.")
    return i % rows


def _entry(item: object) -> object:
    """One entry of an index as NumPy would take it: ``...``, ``None`` (a new axis), an int, a
    slice or an array (integer or boolean); ``TypeError`` for a scalar bool, ``IndexError``
    (as NumPy) for anything else."""
    if item is Ellipsis or item is None or isinstance(item, slice):
        return item
    if isinstance(item, (bool, np.bool_)):
        raise TypeError(
            f"embeddings are indexed by {_KEY_FORMS}; got a bool ({item!r}): index the array "
            f"they give instead, e.g. np.asarray(emb[rows])[True]."
        )
    if isinstance(item, (int, np.integer)):
        return int(item)
    if isinstance(item, (list, np.ndarray)):
        arr = np.asarray(item)
        if isinstance(item, list) and arr.size == 0:
            arr = arr.astype(np.intp)  # [] selects nothing, as in NumPy
        if arr.dtype == bool and arr.ndim == 0:
            return _entry(bool(arr))
        if arr.dtype == bool or arr.dtype.kind in "iu":
            return arr
    raise IndexError(
        f"embeddings are indexed by {_KEY_FORMS}, as NumPy arrays are; got {item!r}: use an "
        f"int (int(x) for a float) or an integer array."
    )


def _dims(entry: object) -> int:
    return entry.ndim if isinstance(entry, np.ndarray) and entry.dtype == bool else 1


def _normalized_key(key: object, shape: tuple[int, int]) -> list[object]:
    """``key`` as two entries, (rows, columns), plus the ``None`` (new axes) it holds, in
    place: ``...`` expanded, a boolean mask replaced by the integer arrays of its true entries
    (what NumPy does), each mask checked against the dimensions it covers."""
    entries = [_entry(item) for item in (key if isinstance(key, tuple) else (key,))]
    if sum(e is Ellipsis for e in entries) > 1:
        raise IndexError("an index can hold only one ellipsis (...).")
    used = sum(_dims(e) for e in entries if e is not Ellipsis and e is not None)
    if used > len(shape):
        raise IndexError(
            f"too many indices: the embeddings are 2-dimensional (rows, width), the index "
            f"has {used}."
        )
    fill = [slice(None)] * (len(shape) - used)
    at = next((i for i, e in enumerate(entries) if e is Ellipsis), len(entries))
    entries[at : at + 1] = fill
    out: list[object] = []
    for e in entries:
        if isinstance(e, np.ndarray) and e.dtype == bool:
            dim = sum(1 for o in out if o is not None)
            covered = shape[dim : dim + e.ndim]
            if e.shape != covered:
                raise IndexError(
                    f"a boolean mask of shape {e.shape} does not match the dimensions it "
                    f"indexes, {covered}."
                )
            out += list(e.nonzero())
        else:
            out.append(e)
    return out


def _row_selection(entry: object, rows: int) -> tuple[np.ndarray, object]:
    """The rows that the row entry of a key selects (each once, in ``0 <= i < rows``, to
    read) and the entry that selects the same thing from those rows alone."""
    if isinstance(entry, slice):
        picked = range(rows)[entry]
        return np.arange(picked.start, picked.stop, picked.step, dtype=np.intp), slice(None)
    if isinstance(entry, int):
        return np.array([_row_number(entry, rows)], dtype=np.intp), 0
    arr = np.asarray(entry)
    if arr.size and (arr.min() < -rows or arr.max() >= rows):
        bad = arr.min() if arr.min() < -rows else arr.max()
        raise IndexError(f"row {bad} is out of range for {rows} rows.")
    wanted = arr.astype(np.intp) % rows if arr.size else arr.astype(np.intp)
    unique, inverse = np.unique(wanted, return_inverse=True)
    return unique, inverse.reshape(arr.shape)


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"{path} is not a bertattn embeddings folder: {why}.")


def open_embeddings(path: str | os.PathLike[str]) -> Embeddings:
    """The embeddings at ``path``: a ``.npy`` file (``(rows, width)`` float32) or a folder
    written by ``bertattn encode ... -o FOLDER/`` (its ``index.json``), rows in input order,
    memory-mapped. Opening reads each shard's header, no row. Raises ``FileNotFoundError`` for
    a missing path and ``ValueError``, naming the file, for a folder without a complete index
    (a run still going, or interrupted: rerun it to finish), an index that names a file outside
    the folder, a shard whose header or size disagrees with the index, or a file that is not a
    ``.npy`` (a ``.jsonl`` output); ``TypeError`` for a ``path`` that is not a str or a path."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(os.fspath(path), bytes):
        raise ArgumentTypeError(
            f"path must be a str or an os.PathLike (a .npy file or an embeddings folder), got "
            f"{describe(path)}."
        )
    if not str(path).strip():
        raise ValueError("path is empty; give a .npy file or an embeddings folder.")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist.")
    if p.is_file():
        return _open_npy(p)
    index = _read_index(p)
    shards, width = shard_list(p, index)
    return Embeddings(p, shards, width, index)


def _open_npy(p: Path) -> Embeddings:
    shape, dtype = npy_layout(p)
    if len(shape) != 2 or dtype != np.float32:
        raise ValueError(
            f"{p} holds a {dtype} array of shape {shape}, not (rows, width) float32; write "
            f"embeddings with bertattn encode, or convert it (a.astype(np.float32))."
        )
    arr = np.load(p, mmap_mode="r", allow_pickle=False)
    emb = Embeddings(p, [{"file": p.name, "rows": shape[0], "first_row": 0}], shape[1], None)
    emb._maps[0] = arr
    return emb


def _read_index(p: Path) -> dict[str, Any]:
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
    return index
