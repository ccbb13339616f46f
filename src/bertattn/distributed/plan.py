"""Planning a chunked encode: chunks of consecutive lines cut by byte ranges, and the identity
(inputs, model, settings) that the manifest records so a rerun can resume safely.

Planning reads nothing but a few bytes at each cut (to put it at a line start), so its cost is
O(number of chunks), not O(lines): no rank waits for a serial pass over the corpus. A
compressed file cannot be entered in the middle and is one chunk. Balance comes from many
chunks handed out one at a time (:mod:`bertattn.distributed.store`, claims), not from a
precomputed cost. Everything here is deterministic: the same files and chunk size give the same
chunks, whatever the number of ranks.

Each chunk ends at the first line end at or after ``start + chunk_bytes``, relative to its own
start: after an edit that changes one line's length, the later chunks are usually the same bytes
at shifted offsets. :func:`chunk_sha256` (the sha256 of a chunk's stored bytes, recorded with
each finished chunk) is what lets ``--restart`` find them and keep them (:mod:`.runner`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..corpus.sources import Source
from ..errors import UsageError

__all__ = [
    "FORMAT_VERSION",
    "Chunk",
    "auto_chunk_bytes",
    "check_identity",
    "chunk_sha256",
    "make_chunks",
    "sha256_file",
    "sha256_files",
]

FORMAT_VERSION = 2
MIN_AUTO_CHUNK_BYTES = 64 << 10  # auto chunks: at least 64 KiB ...
MAX_AUTO_CHUNK_BYTES = 32 << 20  # ... at most 32 MiB ...
AUTO_CHUNKS = 256  # ... and about this many in between (dynamic balance for up to ~64 ranks)
_SEEK = 4 << 10  # bytes first read while looking for the end of a line
_HASH_BLOCK = 1 << 20  # bytes read at a time by chunk_sha256


@dataclass(frozen=True)
class Chunk:
    """Bytes ``start`` (a line start) to ``end`` (after a newline, or the file's end) of input
    file ``file`` (its position in the corpus); ``name`` is the file's name, for messages;
    ``sha256``: the digest of those bytes once read (:func:`chunk_sha256`), recorded with the
    finished chunk (not part of the chunk's identity: equality ignores it)."""

    index: int
    file: int
    start: int
    end: int
    name: str = ""
    sha256: str | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return (
            f"chunk {self.index} ({self.name or f'file {self.file}'} bytes {self.start}-{self.end})"
        )

    def to_list(self) -> list[int]:
        return [self.index, self.file, self.start, self.end]

    @classmethod
    def from_list(cls, row: Sequence[int], names: Sequence[str] = ()) -> Chunk:
        index, file, start, end = (int(x) for x in row)
        return cls(index, file, start, end, names[file] if file < len(names) else "")


def auto_chunk_bytes(total_bytes: int) -> int:
    """Bytes per chunk without ``--chunk-size``: ``total / 256`` within [64 KiB, 32 MiB] (a
    function of the input only, never of the world size, so a rerun with another number of
    ranks finds the same chunks)."""
    return min(
        MAX_AUTO_CHUNK_BYTES, max(MIN_AUTO_CHUNK_BYTES, math.ceil(total_bytes / AUTO_CHUNKS))
    )


def _line_end(src: Source, pos: int) -> int:
    """The first line start at or after ``pos`` (just after a newline at ``pos - 1`` or later),
    or the file's size. Reads 4 KiB first, then twice as much each time, up to 1 MiB."""
    at, n = pos - 1, _SEEK
    while at < src.size:
        piece = src.read_at(at, n)
        if not piece:
            break
        hit = piece.find(b"\n")
        if hit >= 0:
            return at + hit + 1
        at += len(piece)
        n = min(2 * n, 1 << 20)
    return src.size


def make_chunks(files: Sequence[Source], chunk_bytes: int) -> list[Chunk]:
    """Cut every file into chunks of about ``chunk_bytes`` (each ends at the first line end at
    or after its nominal size; a line longer than that is one chunk); a compressed file is one
    chunk, an empty file none. Together the chunks cover every byte, hence every line, once."""
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}.")
    chunks: list[Chunk] = []
    for i, src in enumerate(files):
        if src.size == 0:
            continue
        if src.compression is not None:
            chunks.append(Chunk(len(chunks), i, 0, src.size, src.name))
            continue
        pos = 0
        while pos < src.size:
            end = src.size if pos + chunk_bytes >= src.size else _line_end(src, pos + chunk_bytes)
            chunks.append(Chunk(len(chunks), i, pos, end, src.name))
            pos = end
    return chunks


def chunk_sha256(src: Source, chunk: Chunk, *, block: int = _HASH_BLOCK) -> str:
    """The sha256 (hex) of ``chunk``'s bytes of ``src`` as stored (a compressed file: its
    compressed bytes), read ``block`` bytes at a time. Raises ``ValueError`` when the file ends
    before ``chunk.end`` (it changed since the chunk was planned)."""
    if chunk.start < 0 or chunk.end < chunk.start:
        raise ValueError(f"{chunk.describe()}: not a byte range.")
    if block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}.")
    h = hashlib.sha256()
    pos = chunk.start
    while pos < chunk.end:
        data = src.read_at(pos, min(block, chunk.end - pos))
        if not data:
            raise ValueError(
                f"{chunk.describe()}: the file ends at byte {pos}; it changed since the run was "
                f"planned; pass --restart."
            )
        h.update(data)
        pos += len(data)
    return h.hexdigest()


def check_partition(chunks: Sequence[Chunk], files: Sequence[Source]) -> None:
    """Raise unless ``chunks`` (in index order) cover every non-empty file, byte 0 to its size,
    exactly once, files in order."""
    expect = [(i, f.size) for i, f in enumerate(files) if f.size]
    k = 0
    for i, size in expect:
        pos = 0
        while pos < size:
            c = chunks[k] if k < len(chunks) else None
            if c is None or c.index != k or c.file != i or c.start != pos or c.end <= c.start:
                raise ValueError(
                    f"the chunk list is inconsistent at chunk {k} (expected file {i} from byte "
                    f"{pos}); pass --restart to discard it."
                )
            pos, k = c.end, k + 1
        if pos != size:
            raise ValueError(
                f"the chunks of file {i} end at byte {pos}, the file has {size}; pass --restart."
            )
    if k != len(chunks):
        raise ValueError(f"the chunk list has {len(chunks) - k} chunk(s) too many; pass --restart.")


# ---------------------------------------------------------------------- identity
def sha256_file(path: Path, *, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while data := f.read(block):
            h.update(data)
    return h.hexdigest()


def sha256_files(paths: Sequence[Path]) -> str:
    """One digest over several files: sha256 of the lines ``name sha256``."""
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in paths)
    return hashlib.sha256(lines.encode()).hexdigest()


def _short(digest: str) -> str:
    return digest[:12]


def _names(paths: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _inputs_differ(old: Sequence[str], new: Sequence[str]) -> str:
    """What differs between two lists of input paths, naming the files."""
    gone = [p for p in old if p not in new]
    added = [p for p in new if p not in old]
    if gone and added:
        return f"{_names(gone)} then, {_names(added)} now"
    if added:
        return f"{_names(added)} added to the {len(old)} file(s) of then"
    if gone:
        return f"{_names(gone)} no longer given, of the {len(old)} file(s) of then"
    return f"the same files in another order: {_names(list(old))} then, {_names(list(new))} now"


def _first_difference(old: dict, new: dict) -> tuple[str, dict[str, str]] | None:
    """What first differs between a manifest's identity ``old`` and this run's ``new``:
    ``(kind, details)`` with kind ``format`` / ``inputs`` / ``input`` / ``model`` /
    ``settings``, or None when they agree."""
    if old.get("format") != new["format"]:
        return "format", {"old": repr(old.get("format")), "new": str(new["format"])}
    o_in, n_in = old.get("inputs", []), new["inputs"]
    o_paths = [str(f.get("path")) for f in o_in]
    n_paths = [str(f["path"]) for f in n_in]
    if o_paths != n_paths:
        return "inputs", {"what": _inputs_differ(o_paths, n_paths)}
    for o, n in zip(o_in, n_in, strict=True):
        if o != n:
            what = ", ".join(k for k in n if o.get(k) != n[k] and k != "path")
            return "input", {"path": str(n["path"]), "what": what}
    o_m, n_m = old.get("model", {}), new["model"]
    if o_m.get("sha256") != n_m["sha256"]:
        return "model", {
            "old": f"{_short(str(o_m.get('sha256')))}… in {o_m.get('path')}",
            "new": f"{_short(n_m['sha256'])}… in {n_m['path']}",
        }
    o_s, n_s = old.get("settings", {}), new["settings"]
    diff = [f"{k} {o_s.get(k)!r} -> {n_s.get(k)!r}" for k in n_s if o_s.get(k) != n_s.get(k)]
    if diff:
        return "settings", {"what": ", ".join(diff)}
    return None


#: how each difference reads for the chunks of an interrupted run ...
_INTERRUPTED = {
    "format": "{folder} was written in parts format {old}, this bertattn writes format {new}",
    "inputs": "the input files differ from the interrupted run's ({what})",
    "input": "the input file {path} changed since the interrupted run ({what})",
    "model": "the model changed since the interrupted run (files sha256 {old}, now {new})",
    "settings": "the settings changed since the interrupted run ({what})",
}
#: ... and for a finished sharded output folder
_FINISHED = {
    "format": "{folder}/ holds the finished output of an older bertattn (parts format {old}, "
    "this one writes {new})",
    "inputs": "{folder}/ holds the finished output of another input ({what})",
    "input": "{folder}/ holds the finished output of {path} as it was before it changed ({what})",
    "model": "{folder}/ holds the finished output of another model (files sha256 {old} then, "
    "{new} now)",
    "settings": "{folder}/ holds the finished output of other settings ({what})",
}


def check_identity(old: dict, new: dict, parts_dir: Path, *, finished: bool = False) -> None:
    """Raise ``UsageError`` (the fix is ``--restart``) naming what differs between a
    manifest's identity and this run's. ``finished``: the folder holds a finished sharded
    output (its index), not the chunks of an interrupted run."""
    found = _first_difference(old, new)
    if found is None:
        return
    kind, details = found
    if finished:
        problem = _FINISHED[kind].format(folder=parts_dir, **details)
        raise UsageError(f"{problem}; choose another folder, or pass --restart to replace it.")
    problem = _INTERRUPTED[kind].format(folder=parts_dir, **details)
    if kind in ("input", "inputs"):  # the rows of unchanged input bytes stay valid
        restart = (
            f"pass --restart to start over, keeping the finished chunks in {parts_dir} whose "
            f"input bytes are unchanged"
        )
    else:
        restart = f"pass --restart to discard the finished chunks in {parts_dir}"
    raise UsageError(f"{problem} — {restart}, or rerun with what the interrupted run used.")
