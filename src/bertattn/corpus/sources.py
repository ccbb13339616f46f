"""Where a job's texts come from: one file, a folder of files, or a glob, each file plain text
(one text per line) or JSON lines, plain or compressed (``.gz``, ``.zst``).

A file is read by byte ranges (:meth:`InputFile.read_at`), so that a chunk of it can be read
without the bytes before it; a compressed file cannot be entered in the middle and is read as
one stream (:meth:`InputFile.open_stream`). Anything with the same few members (``name``,
``size``, ``compression``, ``jsonl``, ``read_at``, ``open_stream``, ``identity``) can stand in
for a file: the tests plan and run a billion-line corpus through a virtual one.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..errors import MissingExtraError, UsageError

__all__ = ["COMPRESSIONS", "Corpus", "InputFile", "Source", "is_pipe_or_device", "open_corpus"]

#: suffix -> compression
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")
_READ = 1 << 20  # bytes of a compressed file read at a time
_ZSTD_FEED = 1 << 10  # ... and given to the zstd decompressor at a time
_SAMPLE = 64 << 10  # identity: sha256 of the first and last 64 KiB (with size and mtime)
_GLOB_CHARS = frozenset("*?[")


class Source(Protocol):
    """What the planner and the chunk reader need of an input file."""

    name: str
    size: int
    compression: str | None
    jsonl: bool

    def read_at(self, offset: int, n: int) -> bytes: ...

    def open_stream(self) -> BinaryIO: ...

    def identity(self) -> dict: ...


def _suffixes(path: Path) -> tuple[str | None, bool]:
    """(compression, JSON lines?) from the name: ``a.jsonl.gz`` -> ("gzip", True)."""
    name = path.name.lower()
    compression = None
    for suffix, kind in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = kind, name[: -len(suffix)]
    return compression, name.endswith(JSONL_SUFFIXES)


@dataclass(frozen=True)
class InputFile:
    """One input file on disk (``size`` in bytes, as stored: compressed for ``.gz`` / ``.zst``)."""

    path: Path
    size: int
    mtime_ns: int
    compression: str | None
    jsonl: bool

    @classmethod
    def stat(cls, path: str | os.PathLike[str]) -> InputFile:
        p = Path(path)
        try:
            st = p.stat()
            with p.open("rb"):
                pass
        except OSError as exc:
            raise UsageError(f"input file {p} cannot be read ({exc.strerror or exc}).") from None
        compression, jsonl = _suffixes(p)
        return cls(p, st.st_size, st.st_mtime_ns, compression, jsonl)

    @property
    def name(self) -> str:
        return str(self.path)

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` of the stored file."""
        with self.path.open("rb") as f:
            return os.pread(f.fileno(), n, offset)

    def open_stream(self) -> BinaryIO:
        """The file's bytes, decompressed."""
        if self.compression == "gzip":
            return gzip.open(self.path, "rb")  # type: ignore[return-value]
        if self.compression == "zstd":
            try:
                import zstandard
            except ImportError:
                raise MissingExtraError(f"reading {self.path}", "zstandard", "zstd") from None
            return io.BufferedReader(_ChunksReader(_zstd_frames(self.path, zstandard)))
        return self.path.open("rb")

    def identity(self) -> dict:
        """What a resumable run records of this file: path, size, modification time and the
        sha256 of its first and last 64 KiB. Reading all of a terabyte corpus to hash it would be
        a serial pass; a file rewritten in place with the same size, time and ends is the case
        this does not see."""
        h = hashlib.sha256()
        h.update(self.read_at(0, _SAMPLE))
        if self.size > _SAMPLE:
            h.update(self.read_at(max(_SAMPLE, self.size - _SAMPLE), _SAMPLE))
        return {
            "path": str(self.path),
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "sample_sha256": h.hexdigest(),
        }

    def current_identity(self) -> dict | None:
        """:meth:`identity` of the file as it is now (stat'ed again); None when it is gone."""
        try:
            return InputFile.stat(self.path).identity()
        except (UsageError, OSError):
            return None


class _ChunksReader(io.RawIOBase):
    """A readable binary stream over an iterator of byte strings (closed: the iterator too)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._rest = memoryview(piece)
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._rest))
        view[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if callable(close):
            close()
        super().close()


def _zstd_frames(path: Path, zstandard: Any) -> Iterator[bytes]:
    """The decompressed bytes of every zstd frame of ``path``, in order. Raises ``EOFError``
    when the file ends inside a frame (a truncated file): zstandard's stream reader ends there
    quietly, which gave a short input (the rows of the whole frames only) and no error.

    The decompressor is fed ``_ZSTD_FEED`` bytes at a time: what one call gives back is bounded
    by that times the compression ratio (at most about 32 MiB for a hostile file)."""
    dctx = zstandard.ZstdDecompressor()
    frame = None  # the frame being decompressed: started, not yet at its end
    read = 0
    with path.open("rb") as raw:
        while block := raw.read(_READ):
            read += len(block)
            view = memoryview(block)
            for at in range(0, len(view), _ZSTD_FEED):
                data: Any = view[at : at + _ZSTD_FEED]
                while data:
                    frame = frame or dctx.decompressobj()
                    out = frame.decompress(data)
                    if out:
                        yield out
                    data = frame.unused_data if frame.eof else b""
                    frame = None if frame.eof else frame
    if frame is not None:
        raise EOFError(
            f"the file ends in the middle of a zstd frame, after {read} bytes: it is truncated"
        )


@dataclass(frozen=True)
class Corpus:
    """The input files of a job, in reading order (the order of their lines in the output)."""

    spec: str
    files: tuple[Source, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def identity(self) -> list[dict]:
        return [f.identity() for f in self.files]

    def changes(self, recorded: Sequence[dict]) -> list[str]:
        """The files whose identity now differs from ``recorded`` (what :meth:`identity` gave
        when the job started), each with what differs: ``"in.txt (size, mtime_ns)"``. A
        stand-in source without ``current_identity`` is compared by its :meth:`identity`."""
        out = []
        for src, then in zip(self.files, recorded, strict=True):
            current = getattr(src, "current_identity", src.identity)
            now = current()
            if now is None:
                out.append(f"{src.name} (removed or unreadable)")
            elif now != then:
                what = ", ".join(k for k in now if k != "path" and now.get(k) != then.get(k))
                out.append(f"{src.name} ({what})")
        return out

    def describe(self) -> str:
        if len(self.files) == 1:
            return self.files[0].name
        return f"{self.spec} ({len(self.files)} files)"


def is_pipe_or_device(path: Path) -> bool:
    """A pipe (a FIFO, ``<(command)``) or a character device (``/dev/stdin``): bytes that can be
    read once, front to back, and have no size to plan chunks by."""
    return path.is_fifo() or path.is_char_device()


def _is_glob(spec: str) -> bool:
    return not Path(spec).exists() and any(c in spec for c in _GLOB_CHARS)


def _listing(spec: str) -> list[Path]:
    if _is_glob(spec):
        found = sorted(Path(p) for p in glob.glob(spec))
        files = [p for p in found if p.is_file()]
        if not files:
            raise UsageError(
                f"input pattern {spec!r} matches no file"
                + (f" ({len(found)} folder(s))" if found else "")
                + "; check the pattern (quote it so the shell passes it as it is)."
            )
        return files
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise UsageError(f"input folder {path} holds no file (hidden files are skipped).")
        return files
    if not path.exists():
        raise UsageError(f"input file {path} does not exist.")
    if not path.is_file():
        if is_pipe_or_device(path):
            raise UsageError(
                f"input {path} is a pipe or a device, read once: it cannot be one of several "
                f"inputs or a chunked job's input; give files (a .gz or .zst file as it is)."
            )
        raise UsageError(f"input {path} is not a regular file or a folder.")
    return [path]


def open_corpus(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Corpus:
    """The files of ``spec``: a file, a folder (its non-hidden files, by name; not recursive),
    a glob pattern (``corpus/part-*.jsonl.gz``, matches sorted by name) or a list of those.
    Raises :class:`UsageError` for a missing, empty or unreadable input."""
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    if not specs:
        raise UsageError("no input given.")
    paths: list[Path] = []
    for s in specs:
        paths += _listing(os.fspath(s))
    seen: set[tuple[int, int]] = set()
    files = []
    for p in paths:
        f = InputFile.stat(p)
        st = p.stat()
        if (st.st_dev, st.st_ino) in seen:
            raise UsageError(f"input file {p} is given twice; each file may appear once.")
        seen.add((st.st_dev, st.st_ino))
        files.append(f)
    label = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else ", ".join(map(str, specs))
    return Corpus(label, tuple(files))
