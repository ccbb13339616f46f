"""From bytes to texts: lines of a byte range or a stream, UTF-8, and JSON-lines records.

The rules, the same for a whole file (plain or compressed), a chunk of it and stdin: lines end
at ``\\n`` (a ``\\r`` before it is dropped), the newline that ends the last line does not start
another one, a UTF-8 byte order mark at the start of the file (or stream) is dropped, and every
line must be valid UTF-8. In plain text every line is a text, an empty one too. In JSON lines a
blank line (nothing but spaces, tabs and the line end) is skipped, as JSON-lines readers do, and
every other line must be an object whose text field is a string: a JSON-lines input gives one
text (one output row) per record, not per line. An error names the file and the line number
within the file, blank lines counted. A line is at most :data:`MAX_LINE` bytes (64 MiB): an
input without line ends (``/dev/zero``, a binary file) is refused there, not held in memory as
one endless line. A JSON-lines id must be valid JSON (no NaN / Infinity): it is written out.
"""

from __future__ import annotations

import json
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from .sources import Corpus, Source

__all__ = [
    "Block",
    "decode_line",
    "json_kind",
    "parse_record",
    "read_blocks",
    "read_corpus",
    "refuse_compressed",
    "stream_blocks",
    "strip_bom",
]

READ = 1 << 20  # bytes per read
MAX_LINE = 64 << 20  # bytes per line at most (a text that long is far beyond any model)
BLOCK_LINES = 4096  # texts per Block
BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark (what Windows tools put first)
_BLANK = b" \t\r"  # what a blank JSON line may hold (JSON's whitespace, less the newline)

Where = Callable[[int], str]  # line number within the chunk (1-based) -> "FILE: line N"


@dataclass
class Block:
    """Consecutive records of one chunk: ``texts``, their ``ids`` (with an id field), the
    input bytes they took (``nbytes``; 0 for a compressed file, whose progress is counted at
    its end) and the blank JSON lines skipped among them (``skipped``: line numbers counted
    from 1 at the chunk's first line). A block covers ``lines`` lines of the input; one that
    covers only blank lines (a chunk without a record) holds no text."""

    texts: list[str] = field(default_factory=list)
    ids: list[object] | None = None
    nbytes: int = 0
    skipped: list[int] = field(default_factory=list)

    @property
    def lines(self) -> int:
        """Input lines the block covers: its records and the blank lines skipped."""
        return len(self.texts) + len(self.skipped)


def strip_bom(raw: bytes) -> bytes:
    """``raw`` without a leading UTF-8 byte order mark (for the first line of a file)."""
    return raw[len(BOM) :] if raw.startswith(BOM) else raw


#: the first bytes of compressed data (what a pipe of ``cat f.gz`` or a misnamed file starts with)
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}


def refuse_compressed(first: bytes, where: str, *, by_name: bool = True) -> None:
    """Raise ``ValueError`` when ``first`` (the first bytes of a text input) starts compressed
    data: one clear error instead of an invalid UTF-8 one (or, worse, a line of binary that
    happens to decode). ``by_name``: the reader decompresses a file named .gz / .zst, and the
    message says so."""
    for magic, kind in _MAGIC.items():
        if first.startswith(magic):
            tool = "zcat" if kind == "gzip" else "zstd -dc"
            suffix = ".gz" if kind == "gzip" else ".zst"
            named = f", or give the file itself with a {suffix} name, which is read as it is"
            raise ValueError(
                f"{where}: this is {kind}-compressed data, not text; decompress it first "
                f"({tool} FILE | ...){named if by_name else ''}."
            )


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


def json_kind(value: object, *, json_word: bool = False) -> str:
    """A JSON value's type in JSON's words, with its article: ``"a string"``, ``"a number"``,
    ``"a boolean"``, ``"null"``, ``"an array"``, ``"an object"`` (``json_word``: ``"a JSON
    array"``, ``"JSON null"``)."""
    if value is None:
        article, noun = "", "null"
    elif isinstance(value, bool):
        article, noun = "a", "boolean"
    elif isinstance(value, (int, float)):
        article, noun = "a", "number"
    elif isinstance(value, str):
        article, noun = "a", "string"
    elif isinstance(value, (list, tuple)):
        article, noun = "an", "array"
    else:
        article, noun = "an", "object"
    if json_word:
        article = "a" if article else ""
        noun = f"JSON {noun}"
    return f"{article} {noun}".lstrip()


def _shown(value: object, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_record(
    line: str,
    where: Where,
    n: int,
    text_field: str,
    id_field: str | None,
    *,
    hint: str = "",
) -> tuple[str, object]:
    """(text, id) of one JSON line (id None without ``id_field``). ``hint``: the fix to name
    when the line is not a JSON object (instead of the usual one), e.g. for a file whose name
    says plain text read as JSON lines because a field was given."""
    example = json.dumps({text_field: "..."})
    fix = hint or f"each line must be one JSON object, such as {example}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{where(n)}: not valid JSON ({exc.msg} at column {exc.colno}); {fix}."
        ) from None
    except RecursionError:  # [[[[... thousands deep: Python's JSON reader gives up
        raise ValueError(
            f"{where(n)}: JSON nested too deeply to read (arrays or objects thousands of levels "
            f"deep); {fix}."
        ) from None
    if not isinstance(obj, dict):
        raise ValueError(
            f"{where(n)} is {json_kind(obj, json_word=True)}, not an object with a "
            f"{text_field!r} field; {fix}."
        )
    if text_field not in obj:
        found = f"found: {', '.join(obj)}" if obj else "the object is empty"
        raise ValueError(f"{where(n)}: no field {text_field!r} ({found}); choose it with --field.")
    text = obj[text_field]
    if not isinstance(text, str):
        value = "" if text is None else f" ({_shown(text)})"
        raise ValueError(
            f"{where(n)}: field {text_field!r} is {json_kind(text)}{value}, not a string; give "
            f"every line a string there, such as {example}, or choose another field with "
            f"--field."
        )
    if id_field is None:
        return text, None
    if id_field not in obj:
        raise ValueError(
            f"{where(n)}: no id field {id_field!r} (found: {', '.join(obj)}); choose it with "
            f"--id-field."
        )
    ident = obj[id_field]
    try:  # Python's reader takes NaN / Infinity, which no JSON output may hold
        json.dumps(ident, allow_nan=False)
    except ValueError:
        raise ValueError(
            f"{where(n)}: id field {id_field!r} is or holds {_shown(ident)}, which is not valid "
            f"JSON (NaN and Infinity are not numbers in JSON) and cannot be written to the "
            f"output; give the record an id such as a string or a finite number."
        ) from None
    return text, ident


def _split(
    pieces: Iterable[bytes], where: Where, limit: int = MAX_LINE
) -> Iterator[tuple[bytes, int]]:
    """(line without its newline, bytes it took) for the lines of the concatenated pieces;
    ``ValueError`` naming the line (``where``, numbered from 1) when one is longer than
    ``limit`` bytes, as soon as that is known (before the rest of it is read)."""
    held: list[bytes] = []  # the start of a line whose end is not read yet
    size = n = 0
    for piece in pieces:
        if b"\n" not in piece:
            held.append(piece)
            size += len(piece)
            if size > limit:
                _too_long(where, n + 1, limit)
            continue
        lines = (b"".join([*held, piece]) if held else piece).split(b"\n")
        rest = lines.pop()
        for line in lines:
            n += 1
            if len(line) > limit:
                _too_long(where, n, limit)
            yield line, len(line) + 1
        held, size = ([rest], len(rest)) if rest else ([], 0)
        if size > limit:
            _too_long(where, n + 1, limit)
    if held:
        rest = b"".join(held)
        yield rest, len(rest)


def _too_long(where: Where, n: int, limit: int) -> None:
    most = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
    raise ValueError(
        f"{where(n)}: longer than {most} without a line end, the most bertattn "
        f"reads as one line; this is not text with one record per line (binary data, or "
        f"a device such as /dev/zero): give a text or JSON-lines file."
    )


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
    at_start: bool,
    hint: str = "",
) -> Iterator[Block]:
    """Blocks of the records of ``lines`` (numbered from 1 for ``where``); ``at_start``: the
    lines start the file, so a byte order mark may lead them. A full block is handed on when
    the next record comes, so that blank lines after it are counted in it."""
    block = Block(ids=None if id_field is None else [])
    for n, (raw, took) in enumerate(lines, start=1):
        if n == 1 and at_start:  # a byte order mark leads the file: dropped (its bytes counted)
            raw = strip_bom(raw)
            refuse_compressed(raw, where(n))
        if jsonl and (not raw or raw[0] in _BLANK) and not raw.strip(_BLANK):
            block.skipped.append(n)  # a blank line: no record
            if count_bytes:
                block.nbytes += took
            continue
        if len(block.texts) >= block_lines:
            yield block
            block = Block(ids=None if id_field is None else [])
        line = decode_line(raw, where, n)
        if jsonl:
            text, ident = parse_record(line, where, n, text_field, id_field, hint=hint)
            if block.ids is not None:
                block.ids.append(ident)
        else:
            text = line
            if n == 1 and at_start:
                _warn_if_json_lines(text, where(n))
        block.texts.append(text)
        if count_bytes:
            block.nbytes += took
    if block.lines:
        yield block


def _warn_if_json_lines(first: str, where: str) -> None:
    """A plain-text input whose first line is a JSON object with a string field was most
    likely meant as JSON lines (a ``.json`` name, or piped to stdin): its lines would be
    embedded as raw JSON text. Say so (a warning: it may be meant)."""
    if not (first.startswith("{") and first.rstrip().endswith("}")):
        return
    try:
        obj = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        return
    fields = [k for k, v in obj.items() if isinstance(v, str)] if isinstance(obj, dict) else []
    if fields:
        field = "text" if "text" in fields else fields[0]
        warnings.warn(
            f"{where} is a JSON object, but this input is read as plain text, so each line is "
            f"embedded as raw JSON; for JSON lines name the file .jsonl or give --field "
            f"{field}",
            stacklevel=2,
        )


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
    blocks of at most ``block_lines`` texts. The range must start at a line start and end after
    a newline or at the end of the file. A file is read as JSON lines when its name says so
    (``.jsonl``, ``.ndjson``) or a field is given; ``text_field`` defaults to ``"text"``. A
    JSON-lines range gives one text per record, its blank lines skipped (see the module)."""
    end = src.size if end is None else end
    jsonl = src.jsonl or text_field is not None or id_field is not None
    hint = "" if src.jsonl or not jsonl else _plain_text_hint(src.name, text_field, id_field)
    offset: list[int] = []

    def where(n: int) -> str:
        if start and not offset:
            offset.append(_count_lines(src, start))
        return f"{src.name}: line {n + (offset[0] if offset else 0)}"

    if src.compression is None:
        lines = _split(_range_pieces(src, start, end), where)
    else:
        lines = _split(_stream_with(src), where)
    yield from _records(
        lines,
        where,
        jsonl=jsonl,
        text_field=text_field or "text",
        id_field=id_field,
        block_lines=block_lines,
        count_bytes=src.compression is None,
        at_start=src.compression is not None or start == 0,
        hint=hint,
    )


def _flags(text_field: str | None, id_field: str | None) -> str:
    given = [f for f, v in (("--field", text_field), ("--id-field", id_field)) if v is not None]
    return " and ".join(given) or "--field"


def _plain_text_hint(name: str, text_field: str | None, id_field: str | None) -> str:
    """The fix for a file named as plain text that a field made read as JSON lines."""
    return (
        f"--field/--id-field read every input as JSON lines; {name} looks like plain text: drop "
        f"{_flags(text_field, id_field)}, or give a .jsonl file"
    )


def _stream_with(src: Source) -> Iterator[bytes]:
    with src.open_stream() as stream:
        try:
            yield from _stream_pieces(stream)
        except Exception as exc:
            # gzip: OSError (BadGzipFile), EOFError (truncated), zlib.error; zstandard:
            # ZstdError; a zstd file that ends inside a frame: EOFError (sources._zstd_frames)
            damaged = isinstance(exc, (OSError, EOFError, zlib.error)) or type(
                exc
            ).__module__.startswith("zstandard")
            if not damaged:
                raise
            tool = "gzip -t" if src.compression == "gzip" else "zstd -t"
            raise ValueError(
                f"{src.name}: cannot decompress ({exc}); the file is damaged, truncated or not "
                f"{src.compression}: test it with {tool} {src.name}, then copy or compress it "
                f"again."
            ) from None


def stream_blocks(
    stream: BinaryIO,
    name: str,
    *,
    jsonl: bool,
    text_field: str | None = None,
    id_field: str | None = None,
) -> Iterator[Block]:
    """The records of an open binary stream (stdin), by the same rules; ``jsonl``: the stream
    is JSON lines (as it is anyway when a field is given)."""
    hint = ""
    if not jsonl and (text_field is not None or id_field is not None):
        hint = (
            f"--field/--id-field read {name} as JSON lines: drop "
            f"{_flags(text_field, id_field)} to read one text per line"
        )
    return _records(
        _split(_stream_pieces(stream), lambda n: f"{name}: line {n}"),
        lambda n: f"{name}: line {n}",
        jsonl=jsonl or text_field is not None or id_field is not None,
        text_field=text_field or "text",
        id_field=id_field,
        block_lines=BLOCK_LINES,
        count_bytes=False,
        at_start=True,
        hint=hint,
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
