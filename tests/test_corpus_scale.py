"""Corpus scale without the hardware: a billion-line input (a virtual file) planned and run by
simulated ranks (threads) with a stub encoder, and a million-line one whose every row carries
its line number, with a rank killed mid-run and its chunk redone by the rerun.

What is asserted is the work, not the clock: planning reads O(chunks) bytes whatever the number
of lines, holds O(chunks) memory, every line lands in exactly one row, in input order, and the
shards, the index and the reader agree. The times are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from corpus_sim import WIDTH, VirtualLines, run_ranks

from bertattn.corpus import open_embeddings
from bertattn.corpus.lines import read_blocks
from bertattn.distributed import ChunkStore, DistributedEncodeError, make_chunks, run_chunks
from bertattn.distributed.plan import _SEEK, FORMAT_VERSION


def _identity(src: VirtualLines) -> dict:
    return {
        "format": FORMAT_VERSION,
        "inputs": [src.identity()],
        "model": {"path": "stub", "sha256": "0" * 64},
        "settings": {},
    }


def _line(i: int) -> bytes:
    return f"{i:012d}\n".encode()


def test_billion_lines_plan_in_o_chunks_and_run_exactly_once(tmp_path):
    lines, chunk_bytes = 10**9, 16 << 20
    src = VirtualLines(lines)
    t0 = time.perf_counter()
    chunks = make_chunks([src], chunk_bytes)
    plan_s = time.perf_counter() - t0
    reads, bytes_read = src.reads, src.bytes_read
    tracemalloc.start()
    assert make_chunks([src], chunk_bytes) == chunks  # deterministic
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    n = len(chunks)
    assert n == -(-src.size // chunk_bytes)  # 775 chunks of 16 MiB for 13 GB
    # O(chunks): one short read per cut, never a pass over the lines
    assert reads <= n and bytes_read <= n * _SEEK, (reads, bytes_read)
    assert peak < 4 << 20, peak  # a few hundred bytes per chunk
    assert all(c.start % WIDTH == 0 and c.end % WIDTH == 0 for c in chunks)
    assert [c.start for c in chunks[1:]] == [c.end for c in chunks[:-1]]
    assert chunks[0].start == 0 and chunks[-1].end == src.size

    store = ChunkStore(tmp_path / "out", sharded=True)

    def work(chunk):  # a stub encoder: checks the cut, writes one (empty) row per line
        first, count = chunk.start // WIDTH, chunk.size // WIDTH
        assert src.read_at(chunk.start, WIDTH) == _line(first)
        assert src.read_at(chunk.end - WIDTH, WIDTH) == _line(first + count - 1)
        yield np.empty((count, 0), np.float32), {"tokens": count}, None, chunk.size

    t0 = time.perf_counter()
    results = run_ranks(
        4,
        lambda group: run_chunks(
            store=store,
            files=[src],
            identity=_identity(src),
            work=work,
            width=0,
            chunk_bytes=chunk_bytes,
            group=group,
            poll=0.01,
            digests=False,  # hashing would read the 13 GB virtual corpus once more
        ),
    )
    run_s = time.perf_counter() - t0
    summary = results[0]
    assert results[1:] == [None, None, None], results
    assert summary.texts == lines and summary.tokens == lines and summary.chunks == n
    assert sum(summary.rank_chunks) == n and min(summary.rank_chunks) > 0, summary.rank_chunks
    emb = open_embeddings(tmp_path / "out")
    assert emb.shape == (lines, 0)
    starts = [(s["first_row"], s["first_line"], s["rows"]) for s in emb.index["shards"]]
    assert starts == [(c.start // WIDTH, c.start // WIDTH + 1, c.size // WIDTH) for c in chunks]
    assert emb.locate(lines - 1) == ("virtual.txt", lines)
    assert emb.locate(123_456_789) == ("virtual.txt", 123_456_790)
    print(
        f"\n10^9 lines: planned {n} chunks in {plan_s:.2f}s ({reads} reads, peak "
        f"{peak / 1024:.0f} KiB); 4 simulated ranks ran them in {run_s:.1f}s"
    )


class Killed(BaseException):
    """A rank's sudden death (SIGKILL): no failure marker, no cleanup."""


def _numbered_rows(src: VirtualLines):
    def work(chunk):
        for block in read_blocks(src, chunk.start, chunk.end, block_lines=50_000):
            i = np.array([int(t) for t in block.texts], dtype=np.int64)
            rows = np.stack([i >> 20, i & 0xFFFFF], axis=1).astype(np.float32)  # exact
            yield rows, {}, None, block.nbytes

    return work


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_every_line_once_in_order_and_a_killed_ranks_chunk_is_redone(tmp_path):
    lines = 10**6
    src = VirtualLines(lines)
    store = ChunkStore(tmp_path / "out", sharded=True)
    work = _numbered_rows(src)
    killed_at: list[int] = []

    def run(group, work, **kw):
        return run_chunks(
            store=store,
            files=[src],
            identity=_identity(src),
            work=work,
            width=2,
            chunk_bytes=256 << 10,
            group=group,
            poll=0.01,
            **kw,
        )

    def dying(group):
        def work_or_die(chunk):
            if group.rank == 2:
                killed_at.append(chunk.index)
                raise Killed
            yield from work(chunk)

        return run(group, work_or_die, timeout=1.0)

    first = run_ranks(3, dying)
    assert isinstance(first[2], Killed) and len(killed_at) == 1
    for r in first[:2]:
        assert isinstance(r, DistributedEncodeError), r
        assert f"a rank may have died: 1 chunk(s) not written: {killed_at[0]}" in str(r)
    with pytest.raises(ValueError, match="no index.json"):
        open_embeddings(tmp_path / "out")

    second = run_ranks(2, lambda group: run(group, work))
    summary = second[0]
    assert second[1] is None, second
    assert summary.computed == killed_at, (summary.computed, killed_at)
    assert len(summary.reused) == summary.chunks - 1
    rows = open_embeddings(tmp_path / "out").to_numpy().astype(np.int64)
    got = (rows[:, 0] << 20) + rows[:, 1]
    np.testing.assert_array_equal(got, np.arange(lines))  # every line once, in input order
    assert not list((tmp_path / "out").glob("claim-*"))


def test_a_rank_that_sees_other_files_stops_the_run(tmp_path):
    """Every rank lists the input itself (a glob on each node): one that finds other files than
    rank 0 must not read them as if they were rank 0's."""
    store = ChunkStore(tmp_path / "out", sharded=True)
    mine, other = VirtualLines(1000), VirtualLines(1001)

    def body(group):
        src = mine if group.rank == 0 else other
        return run_chunks(
            store=store,
            files=[src],
            identity=_identity(src),
            work=_numbered_rows(src),
            width=2,
            timeout=1.0,
            group=group,
            poll=0.01,
        )

    results = run_ranks(2, body)
    assert isinstance(results[1], DistributedEncodeError), results
    assert "rank 1 sees other input files than rank 0" in str(results[1])
    assert "['virtual.txt', 13013] vs ['virtual.txt', 13000]" in str(results[1])
