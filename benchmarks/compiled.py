"""``Bert.load(compile=True)`` against the eager encoder, in the same process and rounds.

    python -m benchmarks.compiled [--short 256] [--paragraphs 40] [--rounds 5] [--threads N]

MiniLM (the default model), float32, ``Bert.encode``: one query at a time (a server's call),
then length-sorted batches of 32 of short texts (a docstring's first paragraph each) and of
paragraphs (cut at 256 tokens), eager and compiled interleaved
round by round (the order flips each round), the median of the per-round ratios. It prints the
time compiling took, the largest difference of the embeddings against eager, and the verdict:
a compiled path may become a default only where it is faster here. Timing: wall clock.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from bertattn import Bert
from bertattn.bench import environment

from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus


def _rounds(fns: dict, rounds: int) -> dict[str, list[float]]:
    """``name -> seconds per round`` of each function, interleaved, after one warm-up each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compiled", description=__doc__)
    parser.add_argument("--short", type=int, default=256, help="short texts (default 256)")
    parser.add_argument("--paragraphs", type=int, default=40, help="paragraphs (default 40)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: policy)")
    args = parser.parse_args(argv)
    threads = args.threads or None
    eager = Bert.load(threads=threads)
    start = time.perf_counter()
    compiled = Bert.load(threads=threads, compile=True)
    load_s = time.perf_counter() - start
    env = environment()
    print(
        f"compile=True vs eager, float32, MiniLM; threads={torch.get_num_threads()}, "
        f"{env['processor']}, cpu_capability={env['cpu_capability']}, torch {env['torch']}"
    )
    print(f"  load with compile=True: {load_s:.1f} s; {compiled.compile_choice}")
    if compiled.compiled is None:
        print("  verdict: not measured (the compiled path did not run here; see above)")
        return 0
    sets = {
        f"{args.short} short texts": stdlib_docstring_corpus(args.short),
        f"{args.paragraphs} paragraphs (256 tokens)": stdlib_paragraph_corpus(args.paragraphs),
    }
    faster = True
    query = "how do I read a file line by line in python"
    for _ in range(3):  # batch size 1 is a graph of its own: built before timing
        compiled.encode(query)
    one = _rounds(
        {
            "eager": lambda: [eager.encode(query) for _ in range(50)],
            "compiled": lambda: [compiled.encode(query) for _ in range(50)],
        },
        args.rounds,
    )
    ratio = statistics.median(e / c for e, c in zip(one["eager"], one["compiled"], strict=True))
    print(
        f"  one query (B=1, {len(eager.tokenizer.encode_batch([query])[0].ids)} tokens): eager "
        f"{statistics.median(one['eager']) / 50 * 1e3:.2f} ms, compiled "
        f"{statistics.median(one['compiled']) / 50 * 1e3:.2f} ms: compiled {ratio:.2f}x "
        f"eager's speed"
    )
    for what, texts in sets.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (truncation at 256 tokens is the point)
            a = eager.encode(texts, convert_to_tensor=True, max_length=256)
            b = compiled.encode(texts, convert_to_tensor=True, max_length=256)
            times = _rounds(
                {
                    "eager": lambda t=texts: eager.encode(t, max_length=256),
                    "compiled": lambda t=texts: compiled.encode(t, max_length=256),
                },
                args.rounds,
            )
        ratio = statistics.median(
            e / c for e, c in zip(times["eager"], times["compiled"], strict=True)
        )
        faster = faster and ratio > 1.05
        n = len(texts)
        print(
            f"  {what}: eager {n / statistics.median(times['eager']):.1f} texts/s, compiled "
            f"{n / statistics.median(times['compiled']):.1f} texts/s: compiled {ratio:.2f}x "
            f"eager's speed; max |diff| {float((a - b).abs().max()):.1e}"
        )
    verdict = "faster on both" if faster else "not faster on both: stays opt-in here"
    print(f"  verdict: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
