"""Reading a job's input: one text per line of a UTF-8 file or stdin, or a field of JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import BinaryIO

from ..errors import UsageError

__all__ = ["check_input", "read_records", "read_texts"]

_JSONL_SUFFIXES = (".jsonl", ".ndjson")


def check_input(source: str | Path, *, what: str = "input file") -> Path:
    """An existing, readable regular file (``UsageError`` naming it otherwise)."""
    path = Path(source)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a folder; give a file.")
    if not path.is_file():
        raise UsageError(f"{what} {path} does not exist.")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
    return path


def _lines(stream: BinaryIO, name: str) -> list[str]:
    """Decode each line as UTF-8; an invalid line -> ValueError with its number."""
    out = []
    for n, raw in enumerate(stream.read().split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{name}: line {n}: invalid UTF-8 ({exc.reason} at byte {exc.start} of the "
                f"line); convert the file to UTF-8 first."
            ) from None
    if out and out[-1] == "":  # the newline that ends the last line does not start a new one
        out.pop()
    return out


def _jsonl_records(
    lines: list[str], name: str, field: str, id_field: str | None
) -> tuple[list[str], list[object] | None]:
    texts: list[str] = []
    ids: list[object] | None = None if id_field is None else []
    for n, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: line {n}: not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict) or field not in obj:
            keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(
                f"{name}: line {n}: no field {field!r} (found: {keys}); choose it with --field."
            )
        if not isinstance(obj[field], str):
            raise ValueError(
                f"{name}: line {n}: field {field!r} is a {type(obj[field]).__name__}, not a string."
            )
        texts.append(obj[field])
        if ids is not None:
            if id_field not in obj:
                raise ValueError(
                    f"{name}: line {n}: no id field {id_field!r} (found: {', '.join(obj)}); "
                    f"choose it with --id-field."
                )
            ids.append(obj[id_field])
    return texts, ids


def read_records(
    source: str | Path, *, field: str | None = None, id_field: str | None = None
) -> tuple[list[str], list[object] | None]:
    """The texts of ``source`` (see :func:`read_texts`) and, with ``id_field``, each JSON line's
    id (any JSON value), in input order; ids are None without ``id_field``."""
    name = "<stdin>" if str(source) == "-" else str(source)
    if str(source) == "-":
        lines = _lines(sys.stdin.buffer, name)
    else:
        path = check_input(source)
        with path.open("rb") as f:
            lines = _lines(f, name)
    jsonl = field is not None or id_field is not None
    if jsonl or Path(name).suffix.lower() in _JSONL_SUFFIXES:
        return _jsonl_records(lines, name, field or "text", id_field)
    return lines, None


def read_texts(source: str | Path, *, field: str | None = None) -> list[str]:
    """One text per line of a UTF-8 file (``"-"``: stdin). A ``.jsonl`` file, or any input
    when ``field`` is given, is read as JSON lines and ``field`` (default ``"text"``) taken."""
    return read_records(source, field=field)[0]
