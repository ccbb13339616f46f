"""Reading a job's input: one text per line of UTF-8 files or stdin, or a field of JSON lines
(the rules: :mod:`bertattn.corpus.lines`)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import BinaryIO

from ..errors import UsageError
from ..stdio import is_closed

__all__ = ["check_input", "is_stream", "read_records", "read_texts", "stdin_buffer"]


def check_input(source: str | Path, *, what: str = "input file", stream: bool = False) -> Path:
    """An existing, readable regular file (``UsageError`` naming it otherwise); with
    ``stream``, also a pipe (a FIFO, ``<(command)``) or a character device read once."""
    path = Path(source)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a folder; give a file.")
    if not path.exists():
        raise UsageError(f"{what} {path} does not exist.")
    if not path.is_file() and not (stream and _pipe_or_device(path)):
        raise UsageError(
            f"{what} {path} is not a regular file (a device, pipe or socket); give a file"
            + (", or - to read stdin." if stream else ".")
        )
    if not path.is_file():  # a pipe: opening it to probe would wait for (or lose) its writer
        if not os.access(path, os.R_OK):
            raise UsageError(f"{what} {path} cannot be read (permission denied).")
        return path
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None
    return path


def stdin_buffer(what: str = "input -") -> BinaryIO:
    """``sys.stdin``'s bytes; ``UsageError`` when the process was started without a stdin
    (``<&-``), which ``what`` (``-``) would read."""
    if is_closed(sys.stdin):
        raise UsageError(
            f"{what} reads stdin, which is closed (the command was started with <&-); pipe "
            f"the text in (... | bertattn ...) or give a file."
        )
    return sys.stdin.buffer


def is_stream(source: str | Path) -> bool:
    """Whether ``source`` is an input read once, front to back: ``-`` (stdin), or a path that is
    a pipe (a FIFO, ``<(command)``) or a character device (``/dev/stdin``, ``/dev/null``)."""
    if str(source) == "-":
        return True
    try:
        return _pipe_or_device(Path(source))
    except OSError:  # a name the system cannot even look at: not a stream (open_corpus says why)
        return False


def _pipe_or_device(path: Path) -> bool:
    from ..corpus.sources import is_pipe_or_device  # imported when used: --help stays light

    return is_pipe_or_device(path)


def read_records(
    source: str | Path, *, field: str | None = None, id_field: str | None = None
) -> tuple[list[str], list[object] | None]:
    """The texts of ``source`` (see :func:`read_texts`) and, with ``id_field``, each JSON line's
    id (any JSON value), in input order; ids are None without ``id_field``."""
    from ..corpus.lines import collect, read_corpus, stream_blocks
    from ..corpus.sources import open_corpus

    if not is_stream(source):
        return read_corpus(open_corpus(source), text_field=field, id_field=id_field)
    # stdin, or a pipe or device read once as stdin is
    if str(source) == "-":
        name, stream = "<stdin>", contextlib.nullcontext(stdin_buffer())
    else:
        name = str(source)
        try:
            stream = open(name, "rb")  # noqa: SIM115 (closed below, after the last block)
        except OSError as exc:
            raise UsageError(f"input {name} cannot be read ({exc.strerror or exc}).") from None
    with stream as f:
        jsonl = name != "<stdin>" and Path(name).suffix.lower() == ".jsonl"
        blocks = stream_blocks(f, name, jsonl=jsonl, text_field=field, id_field=id_field)
        return collect(blocks, id_field is not None)


def read_texts(source: str | Path, *, field: str | None = None) -> list[str]:
    """One text per line of a UTF-8 file (``"-"``: stdin; a pipe such as ``<(zcat f.gz)`` is read
    once, like stdin), a folder of files or a glob
    (``.gz`` / ``.zst`` files decompressed); an empty line is an empty text. A ``.jsonl`` file,
    or any input when ``field`` is given, is read as JSON lines and ``field`` (default
    ``"text"``) taken: one text per record, blank lines skipped. A leading UTF-8 byte order
    mark is dropped."""
    return read_records(source, field=field)[0]
