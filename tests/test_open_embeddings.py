"""`bertattn.open_embeddings`: rows of a .npy file or a sharded folder, every way of indexing
them equal to NumPy's on the same rows held in memory; damaged and unfinished folders refused."""

from __future__ import annotations

import json
import re
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bertattn
from bertattn.corpus.embeddings import FORMAT, VERSION, npy_header


def _folder(tmp_path, sizes=(3, 0, 5, 1, 4), width=6):
    """A sharded folder written by hand in the documented format; returns (path, all rows)."""
    rng = np.random.default_rng(0)
    out = tmp_path / "sh"
    out.mkdir()
    shards, row, parts = [], 0, []
    for k, n in enumerate(sizes):
        a = rng.standard_normal((n, width)).astype(np.float32)
        np.save(out / f"chunk-{k:05d}.npy", a)
        (out / f"chunk-{k:05d}.json").write_text(
            json.dumps({"ids": [f"r{row + i}" for i in range(n)]})
        )
        shards.append(
            {
                "file": f"chunk-{k:05d}.npy",
                "rows": n,
                "first_row": row,
                "input": k % 2,
                "first_line": 1 + row,
                "bytes": [0, 1],
                "stats": f"chunk-{k:05d}.json",
            }
        )
        row += n
        parts.append(a)
    index = {
        "format": FORMAT,
        "version": VERSION,
        "rows": row,
        "width": width,
        "dtype": "float32",
        "inputs": ["a.txt", "b.txt"],
        "ids": True,
        "shards": shards,
    }
    (out / "index.json").write_text(json.dumps(index))
    return out, np.concatenate(parts)


def test_every_index_form_equals_numpy(tmp_path):
    out, rows = _folder(tmp_path)
    emb = bertattn.open_embeddings(out)
    assert emb.shape == rows.shape == (13, 6) and len(emb) == 13 and emb.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(emb), rows)
    for key in (0, 12, -1, -13, 3, 8):
        np.testing.assert_array_equal(emb[key], rows[key])
    for key in (slice(None), slice(2, 11), slice(None, None, -3), slice(4, 4), slice(-5, None)):
        np.testing.assert_array_equal(emb[key], rows[key])
    for key in ([12, 0, 3, 3], np.array([[1, 2], [11, 8]]), np.arange(13) % 2 == 0):
        np.testing.assert_array_equal(emb[key], rows[key])
    for key in (13, -14):
        with pytest.raises(IndexError):
            emb[key]
    assert [s for s, _ in emb.shards()] == [0, 3, 3, 8, 9]
    assert emb.ids() == [f"r{i}" for i in range(13)]
    assert emb.locate(4) == ("a.txt", 5)


def test_npy_file_and_the_fixed_header(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "a.npy", a)
    emb = bertattn.open_embeddings(tmp_path / "a.npy")
    np.testing.assert_array_equal(emb[1:3], a[1:3])
    assert emb.locate(2) == (str(tmp_path / "a.npy"), 3) and emb.ids() is None
    # the header a shard writer puts first and rewrites: numpy reads it, any row count fits
    for rows in (0, 4, 10**15):
        head = npy_header(rows, 384)
        assert len(head) == 128
    (tmp_path / "h.npy").write_bytes(npy_header(4, 3) + a.tobytes())
    np.testing.assert_array_equal(np.load(tmp_path / "h.npy"), a)


def test_unfinished_or_damaged_folders_are_refused(tmp_path):
    out, _ = _folder(tmp_path)
    index = json.loads((out / "index.json").read_text())
    (out / "index.json").unlink()
    with pytest.raises(ValueError, match="no index.json .* rerun it to finish"):
        bertattn.open_embeddings(out)
    (out / "index.json").write_text(json.dumps({**index, "rows": 99}))
    with pytest.raises(ValueError, match="the shards hold 13 rows, the index says 99"):
        bertattn.open_embeddings(out)
    (out / "index.json").write_text(json.dumps(index))
    emb = bertattn.open_embeddings(out)
    np.save(out / "chunk-00002.npy", np.zeros((2, 6), np.float32))  # changed after opening
    with pytest.raises(
        ValueError, match=r"chunk-00002.npy holds .* \(2, 6\); the index says \(5, 6\)"
    ):
        emb[5]
    with pytest.raises(FileNotFoundError):
        bertattn.open_embeddings(tmp_path / "nothing")


# ---------------------------------------------------------------------- NumPy's indexing, exactly
N_ROWS, WIDTH = 13, 6
_int = st.integers(-N_ROWS - 2, N_ROWS + 2)
_col = st.integers(-WIDTH - 2, WIDTH + 2)
_maybe = st.none() | st.integers(-N_ROWS - 3, N_ROWS + 3)
_slice = st.builds(slice, _maybe, _maybe, st.none() | st.integers(-4, 4).filter(bool))


def _ints(bound):
    """a list of ints, or the same as an int64 array"""
    lists = st.lists(bound, max_size=6)
    return lists | lists.map(lambda xs: np.array(xs, dtype=np.int64).reshape(-1))


def _mask(n):
    return st.lists(st.booleans(), min_size=n, max_size=n).map(np.array)


_rows_key = _int | _int.map(np.int32) | _slice | _ints(_int) | _mask(N_ROWS)
_cols_key = _col | _slice | _ints(_col) | _mask(WIDTH)
_key = (
    _rows_key
    | st.tuples(_rows_key, _cols_key)
    | st.tuples(st.just(Ellipsis), _cols_key)
    | st.tuples(_rows_key, st.just(Ellipsis))
    | st.tuples(_rows_key)
    | st.just(Ellipsis)
    | st.just(())
    | st.lists(st.lists(_int, min_size=2, max_size=2), min_size=1, max_size=3).map(np.array)
    | st.lists(st.booleans(), min_size=N_ROWS * WIDTH, max_size=N_ROWS * WIDTH).map(
        lambda b: np.array(b).reshape(N_ROWS, WIDTH)
    )
)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out, rows = _folder(tmp_path_factory.mktemp("idx"))
    assert rows.shape == (N_ROWS, WIDTH)
    return bertattn.open_embeddings(out), rows


def _same_as_numpy(emb, rows, key) -> None:
    try:
        want = rows[key]
    except IndexError:
        with pytest.raises(IndexError):
            emb[key]
        return
    got = emb[key]
    assert type(got) is type(want) and got.dtype == want.dtype
    assert np.shape(got) == np.shape(want), key
    np.testing.assert_array_equal(got, want)


@settings(max_examples=400, deadline=None)
@given(key=_key)
def test_any_key_gives_what_numpy_gives(sharded, key):
    _same_as_numpy(*sharded, key)


def test_element_and_row_part_keys(sharded):
    emb, rows = sharded
    for key in ((5, 3), (5, slice(None, 10)), (slice(2, 9), 4), ([5, 3], [1, 2]), (-1, -1)):
        _same_as_numpy(emb, rows, key)
    assert emb[5, 3] == rows[5, 3] and np.shape(emb[5, 3]) == ()
    assert emb[5, :10].shape == (WIDTH,)
    np.testing.assert_array_equal(emb[..., 2], rows[:, 2])
    for key in ((1, 2, 3), (..., ...), np.ones(5, dtype=bool)):
        with pytest.raises(IndexError):
            emb[key]


@pytest.mark.parametrize("key", [True, False, np.True_, np.False_], ids=repr)
def test_a_bare_bool_adds_an_axis_as_numpy(sharded, key):
    emb, rows = sharded
    want, got = rows[key], emb[key]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("key", [(0, True), (True, 0)])
def test_a_scalar_bool_in_a_tuple_is_a_clear_type_error(sharded, key):
    with pytest.raises(TypeError, match="embeddings are indexed by an int, a slice"):
        sharded[0][key]


NEW_AXIS_KEYS = [
    None,
    (None, 5),
    (None, 1),
    (0, None),
    (None, None, 3),
    (5, None, 2),
    (slice(2, 9), None),
    (None, slice(None, None, -3), [0, 2]),
    ([1, 3], None, [0, 2]),
    (None, ..., 1),
    (..., None),
    (None, np.arange(N_ROWS) % 2 == 0),
]


@pytest.mark.parametrize("key", NEW_AXIS_KEYS, ids=repr)
def test_none_adds_an_axis_where_numpy_does(sharded, key):
    emb, rows = sharded
    want = rows[key]  # NumPy answers each of these keys
    got = emb[key]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_none_with_a_row_out_of_range_is_an_index_error(sharded):
    emb, rows = sharded
    _same_as_numpy(emb, rows, (None, N_ROWS))
    with pytest.raises(IndexError, match="out of range"):
        emb[None, N_ROWS]


@pytest.mark.parametrize("key", [1.5, (0, 1.5), "a", [1.0, 2.0], {1}, (0, "b"), object()])
def test_what_numpy_refuses_is_an_index_error(sharded, key):
    emb, rows = sharded
    with pytest.raises(IndexError):
        rows[key]  # the NumPy reference refuses it so
    with pytest.raises(IndexError, match="embeddings are indexed by an int, a slice"):
        emb[key]


def test_locate_is_range_checked_with_numpy_negatives(tmp_path, sharded):
    emb, _ = sharded
    assert emb.locate(-1) == emb.locate(N_ROWS - 1) and emb.locate(-N_ROWS) == emb.locate(0)
    a = np.zeros((50, 3), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    npy = bertattn.open_embeddings(tmp_path / "a.npy")
    assert npy.locate(-5) == (str(tmp_path / "a.npy"), 46)
    assert npy.locate(np.int64(49)) == (str(tmp_path / "a.npy"), 50)
    for bad in (10**9, 50, -51):
        for e in (npy, emb):
            with pytest.raises(IndexError, match="out of range"):
                e.locate(bad if e is npy else bad % 1000 + N_ROWS)
    with pytest.raises(TypeError, match="must be an int"):
        npy.locate(1.0)


# ---------------------------------------------------------------------- index.json is not trusted
def _edit_index(out, edit) -> None:
    index = json.loads((out / "index.json").read_text())
    edit(index)
    (out / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "field, name",
    [
        ("file", "/etc/passwd"),
        ("file", "../x.npy"),
        ("file", "sub/chunk-00000.npy"),
        ("stats", "../x.json"),
        ("stats", "/etc/passwd"),
    ],
)
def test_index_naming_a_file_outside_the_folder_is_refused(tmp_path, field, name):
    out, _ = _folder(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((3, 6), np.float32))  # a valid shard, outside
    (tmp_path / "x.json").write_text("{}")
    _edit_index(out, lambda index: index["shards"][0].update({field: name}))
    with pytest.raises(ValueError, match=rf"index.json: shard 0's .*{name!r}.* is never read"):
        bertattn.open_embeddings(out)


def test_a_link_to_outside_the_folder_is_refused(tmp_path):
    out, _ = _folder(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((3, 6), np.float32))
    (out / "chunk-00000.npy").unlink()
    (out / "chunk-00000.npy").symlink_to(tmp_path / "x.npy")
    with pytest.raises(ValueError, match=r"'chunk-00000.npy' is a link to .*x.npy, outside"):
        bertattn.open_embeddings(out)


def test_truncated_or_mismatched_shards_are_refused_when_opening(tmp_path):
    out, _ = _folder(tmp_path)
    shard = out / "chunk-00002.npy"
    data = shard.read_bytes()
    shard.write_bytes(data[:-7])
    with pytest.raises(ValueError, match=r"chunk-00002.npy is cut short: its header says float32"):
        bertattn.open_embeddings(out)
    shard.write_bytes(data + b"\0" * 24)
    with pytest.raises(ValueError, match=r"chunk-00002.npy has bytes after its rows"):
        bertattn.open_embeddings(out)
    np.save(shard, np.zeros((5, 6), np.float64))
    with pytest.raises(ValueError, match=r"chunk-00002.npy holds a float64 array .* says \(5, 6\)"):
        bertattn.open_embeddings(out)
    np.save(shard, np.zeros((5, 7), np.float32))
    with pytest.raises(ValueError, match=r"chunk-00002.npy holds a float32 array of shape \(5, 7"):
        bertattn.open_embeddings(out)
    shard.write_text('{"index": 0, "embedding": [1.0]}\n')
    with pytest.raises(ValueError, match=r"chunk-00002.npy is not a .npy file"):
        bertattn.open_embeddings(out)
    shard.unlink()
    with pytest.raises(ValueError, match=r"chunk-00002.npy is missing or not a file; .* rerun"):
        bertattn.open_embeddings(out)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda i: i.update(shards="chunk-00000.npy"), "'shards' is not a list of objects"),
        (lambda i: i.update(width="6"), "'width' is '6', not an integer >= 0"),
        (lambda i: i.update(dtype="float64"), "dtype 'float64', not float32"),
        (lambda i: i["shards"][1].update(rows=-1), "shard 1's 'rows' is -1"),
        (lambda i: i["shards"][2].update(input=7), "shard 2 names input 7, of 2"),
        (lambda i: i["shards"][0].pop("first_row"), "shard 0's 'first_row' is None"),
        (lambda i: i.update(inputs=[1, 2]), "'inputs' is not a list of file names"),
    ],
)
def test_malformed_index_fields_name_the_index(tmp_path, edit, message):
    out, _ = _folder(tmp_path)
    _edit_index(out, edit)
    with pytest.raises(ValueError, match=re.escape(message)):
        bertattn.open_embeddings(out)


def test_jsonl_or_truncated_npy_file_is_named(tmp_path):
    (tmp_path / "o.jsonl").write_text('{"index": 0, "embedding": [0.5, 1.5]}\n')
    with pytest.raises(ValueError, match=r"o.jsonl is not a .npy file .* read it line by line"):
        bertattn.open_embeddings(tmp_path / "o.jsonl")
    np.save(tmp_path / "a.npy", np.zeros((50, 4), np.float32))
    data = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "a.npy").write_bytes(data[:200])
    with pytest.raises(ValueError, match=r"a.npy is cut short: .* the file has 200"):
        bertattn.open_embeddings(tmp_path / "a.npy")


def test_corrupt_stats_file_is_named(tmp_path):
    out, _ = _folder(tmp_path)
    emb = bertattn.open_embeddings(out)
    (out / "chunk-00002.json").write_text('{"ids": ["r3", ')
    with pytest.raises(ValueError, match=r"chunk-00002.json is not valid JSON .* rerun the encode"):
        emb.ids()
    with pytest.raises(ValueError, match=r"chunk-00002.json is not valid JSON"):
        emb.locate(4)
    (out / "chunk-00002.json").write_text('{"ids": ["r3"], "skipped": ["x"]}')
    with pytest.raises(ValueError, match=r"chunk-00002.json: 'ids' is not a list of 5 ids"):
        emb.ids()
    with pytest.raises(ValueError, match=r"chunk-00002.json: 'skipped' is not a list of line"):
        emb.locate(4)
    (out / "chunk-00002.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"chunk-00002.json holds list, not a JSON object"):
        emb.ids()


def test_a_header_whose_size_wraps_in_int64_is_refused(tmp_path):
    rows = 2**62 + 2  # rows * 4 * 4 bytes is 2**66 + 32: 32 in int64 arithmetic
    text = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, 4), }}"
    body = (text + " " * (117 - len(text)) + "\n").encode()
    head = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body
    (tmp_path / "h.npy").write_bytes(head + b"\0" * 32)
    with pytest.raises(ValueError, match=rf"h.npy is cut short: .*\({rows}, 4\)"):
        bertattn.open_embeddings(tmp_path / "h.npy")


def test_a_column_of_every_row_holds_one_shard_at_a_time(tmp_path):
    """``emb[:, 0]`` of 20 shards of 1,000 x 384 rows (30 MiB): what it holds at once is about
    one shard (1.5 MiB), not every row."""
    out, rows = _folder(tmp_path, sizes=(1000,) * 20, width=384)
    emb = bertattn.open_embeddings(out)
    tracemalloc.start()
    try:
        got = emb[:, 0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, rows[:, 0])
    assert peak < 6 << 20, peak
