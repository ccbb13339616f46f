"""JSON-lines input as users write it: blank lines (skipped; messages keep the file's line
numbers), a UTF-8 byte order mark, ``--field`` on a plain-text file, and values of the wrong JSON
type, named in JSON's words. Through ``bertattn encode`` (one process, resumable chunks, stdin)
and the readers of :mod:`bertattn.corpus.lines` (plain, .gz, .zst, folders, byte ranges)."""

from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pytest
import zstandard

from bertattn.corpus import open_corpus, open_embeddings
from bertattn.corpus.embeddings import Embeddings, npy_header
from bertattn.corpus.lines import read_blocks, read_corpus, stream_blocks
from bertattn.distributed.plan import make_chunks

TEXTS = ["attention weighs every token", "by its query and key", "a third text", "and a fourth"]
BOM = b"\xef\xbb\xbf"


def _jsonl(texts=TEXTS, **extra) -> list[bytes]:
    return [json.dumps({"text": t, **extra}).encode() for t in texts]


def _clean() -> bytes:
    return b"".join(line + b"\n" for line in _jsonl())


def _with_blanks() -> bytes:
    """TEXTS' records with blank lines before, between (empty, spaces and tabs, CRLF) and after."""
    a, b, c, d = _jsonl()
    return b"\n" + a + b"\n\n" + b + b"\r\n  \t\n\r\n" + c + b"\n" + d + b"\n\n"


@pytest.fixture
def model(tiny_checkpoint):
    return ["--model", tiny_checkpoint, "-q", "--pooling", "cls"]  # cls: no mean-pooling notice


# ---------------------------------------------------------------------- 1. blank lines
def test_blank_lines_are_skipped_and_give_the_clean_files_rows(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clean.jsonl").write_bytes(_clean())
    (tmp_path / "blank.jsonl").write_bytes(_with_blanks())
    ref = cli("encode", "clean.jsonl", "-o", "clean.npy", *model)
    assert ref.code == 0, ref
    r = cli("encode", "blank.jsonl", "-o", "blank.npy", *model)
    assert r.code == 0, r
    assert r.err == ""
    got, want = np.load("blank.npy"), np.load("clean.npy")
    assert got.shape == (len(TEXTS), want.shape[1])  # one row per record, not per line
    assert np.array_equal(got, want)


def test_blank_lines_keep_indices_ids_and_line_numbers(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps({"text": t, "id": f"r{i}"}).encode() for i, t in enumerate(TEXTS)]
    (tmp_path / "ids.jsonl").write_bytes(b"\n\n".join(lines) + b"\n\n\n")
    r = cli("encode", "ids.jsonl", "-o", "o.jsonl", "--id-field", "id", *model)
    assert r.code == 0, r
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(x["index"], x["id"]) for x in rows] == [(i, f"r{i}") for i in range(len(TEXTS))]

    # an error after blank lines names the line of the file, blank lines counted
    a, b, *_ = _jsonl()
    (tmp_path / "bad.jsonl").write_bytes(b"\n" + a + b"\n\n  \n" + b"{oops\n" + b + b"\n")
    r = cli("encode", "bad.jsonl", "-o", "bad.npy", *model)
    assert r.code == 1, r
    assert "bad.jsonl: line 5: not valid JSON (Expecting property name" in r.err, r.err
    assert not (tmp_path / "bad.npy").exists()


def test_plain_text_keeps_its_empty_lines(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\n\n  \nfour\n\n")
    assert read_corpus(open_corpus(tmp_path / "a.txt"))[0] == ["one", "", "  ", "four", ""]


def test_blank_lines_in_compressed_files_folders_and_stdin(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    data = _with_blanks()
    with gzip.open(folder / "p0.jsonl.gz", "wb") as f:
        f.write(data)
    (folder / "p1.ndjson.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (folder / "p2.jsonl").write_bytes(data)
    (folder / "p3.txt").write_bytes(b"x\n\ny\n")  # plain text: the empty line is a text
    assert read_corpus(open_corpus(folder))[0] == TEXTS * 3 + ["x", "", "y"]
    assert read_corpus(open_corpus(str(folder / "p[01].*")))[0] == TEXTS * 2
    # a field makes any input JSON lines, blank lines skipped there too
    (tmp_path / "d.txt").write_bytes(data)
    assert read_corpus(open_corpus(tmp_path / "d.txt"), text_field="text")[0] == TEXTS
    blocks = stream_blocks(io.BytesIO(data), "<stdin>", jsonl=False, text_field="text")
    assert [t for b in blocks for t in b.texts] == TEXTS
    only_blank = list(stream_blocks(io.BytesIO(b"\n \n"), "<stdin>", jsonl=True))
    assert [(b.texts, b.skipped, b.lines) for b in only_blank] == [([], [1, 2], 2)]


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
@pytest.mark.parametrize("jsonl", [False, True])
def test_compressed_bytes_on_a_stream_are_named_not_decoded(kind, jsonl):
    """``cat f.gz | bertattn encode -``: the first line is compressed data; the error says so
    and how to fix it, instead of an invalid UTF-8 (or JSON) error about binary."""
    data = _with_blanks()
    packed = gzip.compress(data) if kind == "gzip" else zstandard.ZstdCompressor().compress(data)
    with pytest.raises(ValueError, match=rf"<stdin>: line 1: this is {kind}-compressed data"):
        list(stream_blocks(io.BytesIO(packed), "<stdin>", jsonl=jsonl))
    # the same bytes decompressed by the reader (a .gz / .zst name) are the texts
    blocks = stream_blocks(io.BytesIO(data), "<stdin>", jsonl=True)
    assert [t for b in blocks for t in b.texts] == TEXTS


def test_blank_lines_on_stdin(cli, model):
    r = cli("encode", "-", "--field", "text", "-o", "-", *model, input=_with_blanks())
    assert r.code == 0, r
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [x["index"] for x in rows] == list(range(len(TEXTS)))


def test_every_byte_range_split_reads_the_same_records(tmp_path):
    """Each chunk boundary the planner can choose (every line start), blank lines included:
    the records are those of the whole file, each blank line is skipped by exactly one range,
    and an error in the second range names the line of the file."""
    data = BOM + _with_blanks()
    src = open_corpus(_write(tmp_path / "in.jsonl", data)).files[0]
    starts = [0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == ord("\n")]
    physical = data.count(b"\n")
    for cut in starts[1:]:
        first, second = list(read_blocks(src, 0, cut)), list(read_blocks(src, cut, src.size))
        assert [t for b in first + second for t in b.texts] == TEXTS, cut
        assert sum(b.lines for b in first + second) == physical, cut
        assert sum(b.nbytes for b in first + second) == len(data), cut
    # tiny blocks: a full block is handed on with the blank lines after it
    blocks = list(read_blocks(src, block_lines=1))
    assert [b.texts for b in blocks] == [[t] for t in TEXTS]
    assert [b.skipped for b in blocks] == [[1, 3], [5, 6], [], [9]]

    lines = data.split(b"\n")
    lines[6] = b'{"text": 3}'  # line 7 of the file: the third record
    src = open_corpus(_write(tmp_path / "bad.jsonl", b"\n".join(lines))).files[0]
    cut = starts[4]  # the second range starts at line 5, a blank line
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 7: field 'text' is a number \(3\)"):
        list(read_blocks(src, cut, src.size))


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_chunked_run_over_blank_lines_equals_the_clean_file(tmp_path, monkeypatch, cli, model):
    """--chunk-size 16 cuts the file at nearly every line; a run of blank lines longer than a
    chunk makes chunks that hold no record (shards of no rows)."""
    monkeypatch.chdir(tmp_path)
    a, b, c, d = _jsonl()
    data = BOM + a + b"\n" + b"\n" * 40 + b + b"\n \n" + c + b"\n\n" + d + b"\n" + b" \n" * 20
    (tmp_path / "blank.jsonl").write_bytes(data)
    (tmp_path / "clean.jsonl").write_bytes(_clean())
    src = open_corpus(tmp_path / "blank.jsonl").files[0]
    chunks = make_chunks([src], 16)
    empty = [c for c in chunks if not any(bl.texts for bl in read_blocks(src, c.start, c.end))]
    assert len(chunks) > 5 and empty  # the chunks do split the file, some hold no record

    ref = cli("encode", "clean.jsonl", "-o", "clean.npy", *model)
    assert ref.code == 0, ref
    want = np.load("clean.npy")
    r = cli("encode", "blank.jsonl", "-o", "o.npy", "--resumable", "--chunk-size", "16", *model)
    assert r.code == 0, r
    # chunks form their own batches (other padding, other GEMM shapes): equal up to float
    # rounding, as docs/corpus.md promises, not byte for byte (on an AVX2 CPU rows differ ~1e-8)
    np.testing.assert_allclose(np.load("o.npy"), want, rtol=0, atol=1e-6)
    r = cli("encode", "blank.jsonl", "-o", "sh/", "--chunk-size", "16", *model)
    assert r.code == 0, r
    emb = open_embeddings("sh")
    assert emb.shape == want.shape
    np.testing.assert_allclose(np.asarray(emb), want, rtol=0, atol=1e-6)
    # every row points back to the physical line of its record, blank lines counted
    lines = data.split(b"\n")
    record_lines = [i + 1 for i, raw in enumerate(lines) if raw.strip(b" \t\r\xef\xbb\xbf")]
    assert len(record_lines) == len(want)
    for row, line in enumerate(record_lines):
        assert emb.locate(row) == ("blank.jsonl", line), row


# ---------------------------------------------------------------------- 2. byte order mark
def test_a_byte_order_mark_is_dropped(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clean.jsonl").write_bytes(_clean())
    (tmp_path / "bom.jsonl").write_bytes(BOM + _clean())
    ref = cli("encode", "clean.jsonl", "-o", "clean.npy", *model)
    assert ref.code == 0, ref
    r = cli("encode", "bom.jsonl", "-o", "bom.npy", *model)
    assert r.code == 0, r
    assert np.load("bom.npy").shape == np.load("clean.npy").shape == (len(TEXTS), 32)
    assert np.array_equal(np.load("bom.npy"), np.load("clean.npy"))
    r = cli("encode", "bom.jsonl", "-o", "chunked.npy", "--resumable", "--chunk-size", "16", *model)
    assert r.code == 0, r
    # a chunked run: equal up to float rounding (its batches differ), as docs/corpus.md promises
    np.testing.assert_allclose(np.load("chunked.npy"), np.load("clean.npy"), rtol=0, atol=1e-6)


def test_a_byte_order_mark_in_every_reader(tmp_path):
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as f:
        f.write(BOM + _clean())
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(BOM + _clean()))
    (tmp_path / "c.txt").write_bytes(BOM + b"one\r\ntwo\n")  # plain text: dropped too
    (tmp_path / "d.jsonl").write_bytes(BOM + b"\n" + _clean())  # then a blank line
    got = read_corpus(open_corpus(sorted(str(p) for p in tmp_path.iterdir())))[0]
    assert got == TEXTS * 2 + ["one", "two"] + TEXTS
    blocks = stream_blocks(io.BytesIO(BOM + _clean()), "<stdin>", jsonl=True)
    assert [t for b in blocks for t in b.texts] == TEXTS
    # only at the start of the file: one later is an error, in JSON's words
    (tmp_path / "e.jsonl").write_bytes(_clean() + BOM + _jsonl()[0] + b"\n")
    with pytest.raises(ValueError, match=r"e\.jsonl: line 5: not valid JSON"):
        read_corpus(open_corpus(tmp_path / "e.jsonl"))


# ---------------------------------------------------------------------- 3. --field on plain text
def test_field_on_a_plain_text_file_says_why(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("a plain sentence\nanother one\n")
    r = cli("encode", "a.txt", "--field", "body", "-o", "o.npy", *model)
    assert r.code == 1, r
    assert r.err.strip().endswith(
        "a.txt: line 1: not valid JSON (Expecting value at column 1); --field/--id-field read "
        "every input as JSON lines; a.txt looks like plain text: drop --field, or give a .jsonl "
        "file."
    ), r.err
    assert not (tmp_path / "o.npy").exists()


PLAIN = "--field/--id-field read every input as JSON lines"


@pytest.mark.parametrize(
    ("name", "data", "fields", "want"),
    [
        (
            "a.txt.gz",
            b"plain\n",
            {"text_field": "body"},
            "a.txt.gz looks like plain text: drop --field,",
        ),
        (
            "a.txt",
            b"42\n",
            {"id_field": "id"},
            f"line 1 is a JSON number, not an object with a 'text' field; {PLAIN}; a.txt looks "
            f"like plain text: drop --id-field,",
        ),
        ("a.log", b"x\n", {"text_field": "t", "id_field": "i"}, "drop --field and --id-field, or"),
    ],
)
def test_plain_text_hint_for_every_plain_name(tmp_path, monkeypatch, name, data, fields, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ValueError) as info:
        read_corpus(open_corpus(name), **fields)
    assert want in str(info.value)


def test_no_plain_text_hint_for_a_jsonl_file(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b"not json\n"))
    with pytest.raises(ValueError) as info:
        read_corpus(open_corpus(tmp_path / "a.jsonl.gz"), text_field="body")
    assert str(info.value) == (
        f"{tmp_path / 'a.jsonl.gz'}: line 1: not valid JSON (Expecting value at column 1); each "
        'line must be one JSON object, such as {"body": "..."}.'
    )


def test_field_on_plain_stdin_says_why(cli, model):
    r = cli("encode", "-", "--field", "body", "-o", "o.npy", *model, input="plain text\n")
    assert r.code == 1, r
    assert (
        "<stdin>: line 1: not valid JSON (Expecting value at column 1); --field/--id-field read "
        "<stdin> as JSON lines: drop --field to read one text per line." in r.err
    ), r.err


# ---------------------------------------------------------------------- 4. JSON's words
EXAMPLE = '{"text": "..."}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            b'{"text": 1}',
            f"line 2: field 'text' is a number (1), not a string; give every line a string there, "
            f"such as {EXAMPLE}, or choose another field with --field.",
        ),
        (b'{"text": 2.5}', "line 2: field 'text' is a number (2.5), not a string;"),
        (b'{"text": null}', "line 2: field 'text' is null, not a string;"),
        (b'{"text": true}', "line 2: field 'text' is a boolean (true), not a string;"),
        (b'{"text": ["a"]}', "line 2: field 'text' is an array ([\"a\"]), not a string;"),
        (b'{"text": {"a": 1}}', "line 2: field 'text' is an object ({\"a\": 1}), not a string;"),
        (
            b'["a", "b"]',
            f"line 2 is a JSON array, not an object with a 'text' field; each line must be one "
            f"JSON object, such as {EXAMPLE}.",
        ),
        (b'"just a string"', "line 2 is a JSON string, not an object with a 'text' field;"),
        (b"7", "line 2 is a JSON number, not an object with a 'text' field;"),
        (b"null", "line 2 is JSON null, not an object with a 'text' field;"),
        (b"{}", "line 2: no field 'text' (the object is empty); choose it with --field."),
        (b'{"body": "x", "id": 1}', "line 2: no field 'text' (found: body, id); choose it with"),
    ],
)
def test_wrong_types_in_json_words(tmp_path, line, message):
    path = _write(tmp_path / "in.jsonl", _jsonl()[0] + b"\n" + line + b"\n")
    with pytest.raises(ValueError) as info:
        read_corpus(open_corpus(path))
    text = str(info.value)
    assert text.startswith(f"{path}: {message}"), text
    for python in ("NoneType", " int,", " int ", " float", " bool ", " list", " dict", " str,"):
        assert python not in text


def test_wrong_types_through_the_cli(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "n.jsonl").write_text('{"text": "ok"}\n\n{"text": null}\n')
    r = cli("encode", "n.jsonl", "-o", "o.npy", *model)
    assert r.code == 1, r
    assert "n.jsonl: line 3: field 'text' is null, not a string; give every line a string" in r.err
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n[1, 2]\n')
    r = cli("encode", "a.jsonl", "-o", "o.npy", *model)
    assert r.code == 1, r
    assert "a.jsonl: line 2 is a JSON array, not an object with a 'text' field;" in r.err, r.err
    assert not (tmp_path / "o.npy").exists()


# ---------------------------------------------------------------------- rows back to lines
def test_locate_counts_the_blank_lines_a_shard_skipped(tmp_path):
    """A shard's stats may list the blank lines it skipped (counted from its first line):
    :meth:`Embeddings.locate` gives each row the line of the file it came from."""
    rows = np.zeros((3, 2), dtype=np.float32)
    (tmp_path / "chunk-00000.npy").write_bytes(npy_header(3, 2) + rows.tobytes())
    (tmp_path / "chunk-00000.json").write_text(json.dumps({"rows": 3, "skipped": [1, 3, 4]}))
    (tmp_path / "chunk-00001.npy").write_bytes(npy_header(1, 2) + rows[:1].tobytes())
    (tmp_path / "chunk-00001.json").write_text(json.dumps({"rows": 1}))
    shards = [
        {"file": "chunk-00000.npy", "rows": 3, "first_row": 0, "input": 0, "first_line": 1,
         "stats": "chunk-00000.json"},
        {"file": "chunk-00001.npy", "rows": 1, "first_row": 3, "input": 0, "first_line": 7,
         "stats": "chunk-00001.json"},
    ]  # fmt: skip
    emb = Embeddings(tmp_path, shards, 2, {"inputs": ["in.jsonl"], "shards": shards})
    # lines: 1 blank, 2 row 0, 3 blank, 4 blank, 5 row 1, 6 row 2 | 7 row 3
    assert [emb.locate(i) for i in range(4)] == [("in.jsonl", n) for n in (2, 5, 6, 7)]


# ---------------------------------------------------------------------- JSON read as plain text
def test_json_lines_read_as_plain_text_are_warned_about(tmp_path, monkeypatch, cli, model):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.json").write_text('{"id": 1, "body": "a"}\n{"id": 2, "body": "b"}\n')
    r = cli("encode", "d.json", "-o", "o.npy", *model)
    assert r.code == 0, r
    assert (
        "warning: d.json: line 1 is a JSON object, but this input is read as plain text, so each "
        "line is embedded as raw JSON; for JSON lines name the file .jsonl or give --field body"
    ) in r.err
    r = cli("encode", "-", "-o", "p.npy", *model, input=b'{"text": "x"}\n')
    assert r.code == 0 and "<stdin>: line 1 is a JSON object" in r.err, r
    (tmp_path / "t.txt").write_text("{not json, just braces}\n")
    r = cli("encode", "t.txt", "-o", "q.npy", *model)
    assert r.code == 0 and "JSON" not in r.err, r
