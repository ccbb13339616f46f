"""What :func:`bertattn.corpus.open_embeddings` checks before it trusts a file: a ``.npy``
file's header against its size, and a sharded folder's ``index.json`` against the folder (every
file it names is a file of the folder itself, never a path outside it; every shard's header
holds the rows, width and dtype the index says). Each failure is a ``ValueError`` naming the
file, what it holds, what was expected and the fix. Reading the headers costs one small read per
shard at opening; no row is read.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["INDEX", "damaged", "inside", "npy_layout", "read_stats", "shard_list"]

INDEX = "index.json"

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}
_OPEN = (
    "open_embeddings reads a .npy file of (rows, width) float32, or a folder written by "
    "bertattn encode ... -o FOLDER/"
)


def damaged(folder: Path, problem: str) -> ValueError:
    """A sharded folder whose files disagree with its index (or a ``.npy`` file changed since
    it was opened): ``problem`` and the fix."""
    how = ""
    if folder.is_dir():
        how = " (it checks the finished chunks, computes the damaged ones again and rewrites "
        how += "the index)"
    return ValueError(
        f"{problem}; {folder} is damaged or was changed after the run: rerun the encode command "
        f"that wrote it{how}."
    )


def npy_layout(path: Path, *, folder: Path | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype ``path``'s ``.npy`` header declares, once the file is known to hold
    exactly that much data (a file cut short, or with bytes after its rows, is refused).
    ``folder``: the sharded folder ``path`` is a shard of (said in the fix)."""
    try:
        with path.open("rb") as f:
            shape, dtype = _header(f, path)
            expected = f.tell() + math.prod(shape) * dtype.itemsize  # exact: no int64 wrap
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        what = f"{path} cannot be read ({exc.strerror or exc})"
        if folder is None:
            raise ValueError(f"{what}.") from None
        raise damaged(folder, what) from None
    if size != expected:
        how = "is cut short" if size < expected else "has bytes after its rows"
        what = (
            f"{path} {how}: its header says {dtype} {shape}, which is {expected} bytes with the "
            f"header, and the file has {size}"
        )
        raise damaged(folder, what) if folder is not None else ValueError(f"{what}.")
    return shape, dtype


def _header(f: Any, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not read here")
        shape, _fortran, dtype = reader(f)
    except ValueError as exc:
        hint = ""
        if path.suffix.lower() in (".jsonl", ".ndjson"):
            hint = " (a .jsonl output is JSON lines: read it line by line with json.loads)"
        raise ValueError(
            f"{path} is not a .npy file ({' '.join(str(exc).split())}); {_OPEN}{hint}."
        ) from None
    return tuple(int(n) for n in shape), np.dtype(dtype)


def inside(folder: Path, name: object, what: str) -> Path:
    """``folder / name`` when ``name`` is the name of a file of ``folder`` itself (not a path,
    not ``..``, not a link to outside it); ``what``: where the index names it, for the error."""
    index = folder / INDEX
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise damaged(
            folder,
            f"{index}: {what} is {name!r}, not the name of a file in the folder (such as "
            f"chunk-00000.npy); a path (absolute, with '..' or a folder) is never read",
        )
    path = folder / name
    if path.resolve().parent != folder.resolve():
        raise damaged(
            folder, f"{index}: {what} {name!r} is a link to {path.resolve()}, outside {folder}"
        )
    return path


def read_stats(folder: Path, name: object, what: str) -> dict[str, Any]:
    """A shard's counts file (``chunk-NNNNN.json``), which must be a JSON object."""
    path = inside(folder, name, what)
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise damaged(folder, f"{path} cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise damaged(folder, f"{path} is not valid JSON ({exc})") from None
    if not isinstance(stats, dict):
        raise damaged(folder, f"{path} holds {type(stats).__name__}, not a JSON object")
    return stats


def _count(value: object, least: int) -> int | None:
    """``value`` when it is an int (not a bool) of at least ``least``, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
    return value if ok else None  # type: ignore[return-value]


def _field(folder: Path, where: str, obj: dict, key: str, least: int) -> int:
    value = _count(obj.get(key), least)
    if value is None:
        raise damaged(
            folder,
            f"{folder / INDEX}: {where}{key!r} is {obj.get(key)!r}, not an integer >= {least}",
        )
    return value


def shard_list(folder: Path, index: dict) -> tuple[list[dict[str, Any]], int]:
    """The shards of ``index`` and the width, each shard checked against the folder: its
    file and counts file inside the folder, its rows where the previous one ended, its input
    one of the index's, its ``.npy`` header ``(rows, width)`` float32 and its size to match."""
    width = _field(folder, "", index, "width", 0)
    total = _field(folder, "", index, "rows", 0)
    inputs, shards = index.get("inputs"), index.get("shards")
    if index.get("dtype") != "float32":
        raise damaged(folder, f"{folder / INDEX}: dtype {index.get('dtype')!r}, not float32")
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise damaged(folder, f"{folder / INDEX}: 'inputs' is not a list of file names")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise damaged(folder, f"{folder / INDEX}: 'shards' is not a list of objects")
    row = 0
    for k, s in enumerate(shards):
        where = f"shard {k}'s "
        path = inside(folder, s.get("file"), f"{where}file")
        rows = _field(folder, where, s, "rows", 0)
        if _field(folder, where, s, "first_row", 0) != row:
            raise damaged(
                folder,
                f"{folder / INDEX}: shard {k} ({path.name}) starts at row "
                f"{s['first_row']}, not {row} where the shard before it ends",
            )
        if _field(folder, where, s, "input", 0) >= len(inputs):
            raise damaged(
                folder,
                f"{folder / INDEX}: shard {k} names input {s['input']}, of {len(inputs)}",
            )
        _field(folder, where, s, "first_line", 1)
        if "stats" in s:
            inside(folder, s["stats"], f"{where}stats file")
        _check_shard(folder, path, rows, width)
        row += rows
    if row != total:
        raise damaged(
            folder, f"{folder / INDEX}: the shards hold {row} rows, the index says {total}"
        )
    return shards, width


def _check_shard(folder: Path, path: Path, rows: int, width: int) -> None:
    if not path.is_file():
        raise damaged(folder, f"{path} is missing or not a file")
    shape, dtype = npy_layout(path, folder=folder)
    if shape != (rows, width) or dtype != np.float32:
        raise damaged(
            folder,
            f"{path} holds a {dtype} array of shape {shape}; {folder / INDEX} says "
            f"({rows}, {width}) float32",
        )
