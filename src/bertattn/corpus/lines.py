"""From bytes to texts: lines of a byte range or a stream, UTF-8, and JSON-lines records.

The rules, the same for a whole file, a chunk of it and stdin: lines end at ``\\n`` (a ``\\r``
before it is dropped), the newline that ends the last line does not start another one, every
line must be valid UTF-8, and a JSON-lines record must be an object whose text field is a
string. An error names the file and the line number within the file.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from .sources import Corpus, Source

__all__ = ["Block", "decode_line", "parse_record", "read_blocks", "read_corpus", "stream_blocks"]

READ = 1 << 20  # bytes per read
BLOCK_LINES = 4096  # texts per Block

Where = Callable[[int], str]  # line number within the chunk (1-based) -> "FILE: line N"


@dataclass
class Block:
    """Consecutive records of one chunk: ``texts``, their ``ids`` (with an id field) and the
    input bytes they took (``nbytes``; 0 for a compressed file, whose progress is counted at
    its end)."""

    texts: list[str] = field(default_factory=list)
    ids: list[object] | None = None
    nbytes: int = 0


def decode_line(raw: bytes, where: Where, n: int) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{where(n)}: invalid UTF-8 ({exc.reason} at byte {exc.start} of the line); convert "
            f"the file to UTF-8 first."
        ) from None


def parse_record(
    line: str, where: Where, n: int, text_field: str, id_field: str | None
) -> tuple[str, object]:
    """(text, id) of one JSON line (id None without ``id_field``)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where(n)}: not valid JSON ({exc.msg}).") from None
    if not isinstance(obj, dict) or text_field not in obj:
        keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(
            f"{where(n)}: no field {text_field!r} (found: {keys}); choose it with --field."
        )
    text = obj[text_field]
    if not isinstance(text, str):
        raise ValueError(
            f"{where(n)}: field {text_field!r} is a {type(text).__name__}, not a string."
        )
    if id_field is None:
        return text, None
    if id_field not in obj:
        raise ValueError(
            f"{where(n)}: no id field {id_field!r} (found: {', '.join(obj)}); choose it with "
            f"--id-field."
        )
    return text, obj[id_field]


def _split(pieces: Iterable[bytes]) -> Iterator[tuple[bytes, int]]:
    """(line without its newline, bytes it took) for the lines of the concatenated pieces."""
    rest = b""
    for piece in pieces:
        data = rest + piece if rest else piece
        lines = data.split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line, len(line) + 1
    if rest:
        yield rest, len(rest)


def _range_pieces(src: Source, start: int, end: int) -> Iterator[bytes]:
    pos = start
    while pos < end:
        piece = src.read_at(pos, min(READ, end - pos))
        if not piece:
            raise ValueError(
                f"{src.name} ended at byte {pos}, before byte {end}: the file shrank since the "
                f"run was planned; pass --restart."
            )
        pos += len(piece)
        yield piece


def _stream_pieces(stream: BinaryIO) -> Iterator[bytes]:
    while piece := stream.read(READ):
        yield piece


def _records(
    lines: Iterable[tuple[bytes, int]],
    where: Where,
    *,
    jsonl: bool,
    text_field: str,
    id_field: str | None,
    block_lines: int,
    count_bytes: bool,
) -> Iterator[Block]:
    block = Block(ids=None if id_field is None else [])
    for n, (raw, took) in enumerate(lines, start=1):
        line = decode_line(raw, where, n)
        if jsonl:
            text, ident = parse_record(line, where, n, text_field, id_field)
            if block.ids is not None:
                block.ids.append(ident)
        else:
            text = line
        block.texts.append(text)
        if count_bytes:
            block.nbytes += took
        if len(block.texts) >= block_lines:
            yield block
            block = Block(ids=None if id_field is None else [])
    if block.texts:
        yield block


def _count_lines(src: Source, end: int) -> int:
    """Newlines in the first ``end`` bytes (for an error's line number; read only then)."""
    return sum(piece.count(b"\n") for piece in _range_pieces(src, 0, end))


def read_blocks(
    src: Source,
    start: int = 0,
    end: int | None = None,
    *,
    text_field: str | None = None,
    id_field: str | None = None,
    block_lines: int = BLOCK_LINES,
) -> Iterator[Block]:
    """The records of bytes ``start``..``end`` of ``src`` (a compressed file: all of it), in
    blocks of at most ``block_lines``. The range must start at a line start and end after a
    newline or at the end of the file. A file is read as JSON lines when its name says so
    (``.jsonl``, ``.ndjson``) or a field is given; ``text_field`` defaults to ``"text"``."""
    end = src.size if end is None else end
    jsonl = src.jsonl or text_field is not None or id_field is not None
    offset: list[int] = []

    def where(n: int) -> str:
        if start and not offset:
            offset.append(_count_lines(src, start))
        return f"{src.name}: line {n + (offset[0] if offset else 0)}"

    if src.compression is None:
        lines = _split(_range_pieces(src, start, end))
    else:
        lines = _split(_stream_with(src))
    yield from _records(
        lines,
        where,
        jsonl=jsonl,
        text_field=text_field or "text",
        id_field=id_field,
        block_lines=block_lines,
        count_bytes=src.compression is None,
    )


def _stream_with(src: Source) -> Iterator[bytes]:
    with src.open_stream() as stream:
        try:
            yield from _stream_pieces(stream)
        except Exception as exc:
            # gzip: OSError (BadGzipFile), EOFError, zlib.error; zstandard: ZstdError
            damaged = isinstance(exc, (OSError, EOFError, zlib.error)) or type(
                exc
            ).__module__.startswith("zstandard")
            if not damaged:
                raise
            raise ValueError(
                f"{src.name}: cannot decompress ({exc}); the file is damaged or not "
                f"{src.compression}."
            ) from None


def stream_blocks(
    stream: BinaryIO,
    name: str,
    *,
    jsonl: bool,
    text_field: str | None = None,
    id_field: str | None = None,
) -> Iterator[Block]:
    """The records of an open binary stream (stdin), by the same rules."""
    return _records(
        _split(_stream_pieces(stream)),
        lambda n: f"{name}: line {n}",
        jsonl=jsonl or text_field is not None or id_field is not None,
        text_field=text_field or "text",
        id_field=id_field,
        block_lines=BLOCK_LINES,
        count_bytes=False,
    )


def collect(blocks: Iterable[Block], with_ids: bool) -> tuple[list[str], list[object] | None]:
    """Every text (and id) of ``blocks``, in order."""
    texts: list[str] = []
    ids: list[object] | None = [] if with_ids else None
    for b in blocks:
        texts += b.texts
        if ids is not None and b.ids is not None:
            ids += b.ids
    return texts, ids


def read_corpus(
    corpus: Corpus, *, text_field: str | None = None, id_field: str | None = None
) -> tuple[list[str], list[object] | None]:
    """Every record of every file of ``corpus``, in order (for a job that holds them all)."""

    def blocks() -> Iterator[Block]:
        for src in corpus.files:
            yield from read_blocks(src, text_field=text_field, id_field=id_field)

    return collect(blocks(), id_field is not None)
