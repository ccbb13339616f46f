"""Corpus-scale encode: what rank 0 does before the first batch, before and after byte-range
planning, and end-to-end rows/s of the real model with ``--workers``.

    python -m benchmarks.corpus_scale [--lines 1000000] [--e2e-lines 1000000] [--workers 2]

The input: the 600 first paragraphs of the standard library's docstrings (benchmarks/corpus.py),
repeated to ``--lines`` lines. "Before" is the token-count pass the earlier planner ran on rank
0 over every line (the model's tokenizer, batches of 8,192, truncated to the model's length);
"after" is :func:`bertattn.distributed.make_chunks` on the same file. End to end runs
``bertattn encode FILE -o OUT/ --workers N`` on the first ``--e2e-lines`` lines as a subprocess
(tokenization, model, shards and index included).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertattn.bench import environment

from .corpus import stdlib_docstring_corpus


def _write(path: Path, lines: int) -> int:
    base = stdlib_docstring_corpus(600)
    with path.open("w", encoding="utf-8") as f:
        for text in itertools.islice(itertools.cycle(base), lines):
            f.write(text + "\n")
    return path.stat().st_size


def _plan_before(path: Path) -> float:
    from bertattn import Bert

    bert = Bert.load()
    t0 = time.perf_counter()
    with path.open(encoding="utf-8") as f:
        block: list[str] = []
        for line in f:
            block.append(line.rstrip("\n"))
            if len(block) == 8192:
                bert.tokenizer.encode_batch(block, max_length=bert.max_length)
                block = []
        if block:
            bert.tokenizer.encode_batch(block, max_length=bert.max_length)
    return time.perf_counter() - t0


def _plan_after(path: Path) -> tuple[float, int]:
    from bertattn.corpus import InputFile
    from bertattn.distributed import auto_chunk_bytes, make_chunks

    src = InputFile.stat(path)
    t0 = time.perf_counter()
    chunks = make_chunks([src], auto_chunk_bytes(src.size))
    return time.perf_counter() - t0, len(chunks)


def _end_to_end(path: Path, lines: int, workers: int, folder: Path) -> dict[str, float]:
    part = folder / "e2e.txt"
    with path.open("rb") as src, part.open("wb") as dst:
        dst.writelines(itertools.islice(src, lines))
    out = folder / "emb"
    cmd = [sys.executable, "-m", "bertattn", "encode", str(part), "-o", f"{out}/", "-q"]
    cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - t0
    index = json.loads((out / "index.json").read_text())
    return {"lines": index["rows"], "seconds": seconds, "rows_per_s": index["rows"] / seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=1_000_000, help="lines of the planning input")
    p.add_argument("--e2e-lines", type=int, default=1_000_000, help="lines encoded end to end")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    env = environment()
    print(f"corpus-scale encode; {env}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "corpus.txt"
        size = _write(path, args.lines)
        before = _plan_before(path)
        after, chunks = _plan_after(path)
        per = 1e6 / args.lines
        print(f"planning input: {args.lines:,} lines, {size / 2**20:.0f} MiB")
        print(
            f"  before (token counts of every line, rank 0): {before:.2f} s = "
            f"{before * per:.2f} s per 10^6 lines ({args.lines / before:,.0f} lines/s)"
        )
        print(
            f"  after  (byte ranges, {chunks} chunks):           {after * 1e3:.2f} ms = "
            f"{after * per * 1e3:.2f} ms per 10^6 lines (O(chunks), not O(lines))"
        )
        e2e = _end_to_end(path, args.e2e_lines, args.workers, folder)
        print(
            f"end to end, all-MiniLM-L6-v2 fp32, --workers {args.workers} (OMP threads = cores / "
            f"workers), {e2e['lines']:,} lines -> sharded folder: {e2e['seconds']:.1f} s, "
            f"{e2e['rows_per_s']:.0f} rows/s"
        )
        hours = 1e9 / e2e["rows_per_s"] / 3600
        from bertattn.distributed import auto_chunk_bytes

        big = 1e9 * size / args.lines  # bytes of a 10^9-line corpus of these lines
        plan_big = big / auto_chunk_bytes(int(big)) * after / chunks
        print(
            f"extrapolation to 10^9 such lines ({big / 2**30:,.0f} GiB): planning on rank 0 "
            f"{plan_big:.2f} s (before: {before * 1e9 / args.lines / 3600:.1f} h of "
            f"tokenization while every other rank waits); encoding {hours:,.0f} hours of this "
            f"machine, i.e. divided by the number of such machines"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "environment": env,
                    "lines": args.lines,
                    "bytes": size,
                    "plan_before_s": before,
                    "plan_after_s": after,
                    "chunks": chunks,
                    "end_to_end": e2e,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
