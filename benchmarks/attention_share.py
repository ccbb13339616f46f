"""Where a paragraph's time goes: the attention kernel's share of ``Bert.encode``'s time against
its share of the FLOPs (issue 55: at most 1.5x), on the default model, per backend and dtype.

    python -m benchmarks.attention_share [--paragraphs 24] [--length 256] [--rounds 3]
                                         [--backends sdpa,varlen,math] [--dtypes float32]

Every registered backend's kernel call is wrapped with a timer (this thread's CPU time, so run
it with ``--threads 1`` on a shared machine; wall time otherwise), and so is the whole encode;
the attention's FLOPs are ``4 L_i^2 E`` per layer and text (scores and the weighted sum), the
products' ``2 L_i (4 E^2 + 2 E I)`` (q/k/v, output, the two feed-forward linears). The share of
time over the share of FLOPs is the figure the issue bounds: 1.0 means the attention runs at
the products' rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from bertattn import Bert
from bertattn.attention import backends as _backends
from bertattn.bench import environment

from .corpus import stdlib_paragraph_corpus


@contextmanager
def timed_kernels(clock: Callable[[], float], spent: list[float]) -> Iterator[None]:
    """Inside the block, every backend kernel's time is added to ``spent[0]``."""
    saved = dict(_backends.BACKENDS)

    def wrap(fn: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object, **kwargs: object) -> object:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += clock() - t0

        return timed

    for name, spec in saved.items():
        _backends.BACKENDS[name] = replace(spec, fn=wrap(spec.fn))
    try:
        yield
    finally:
        _backends.BACKENDS.clear()
        _backends.BACKENDS.update(saved)


def flops(bert: Bert, texts: list[str], length: int) -> tuple[float, float]:
    """(attention, products) FLOPs of encoding ``texts`` cut at ``length`` tokens."""
    cfg = bert.model.config
    e, inner, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lens = [len(enc.ids) for enc in bert.tokenizer.encode_batch(texts, max_length=length)]
    attn = sum(4 * n * n * e for n in lens) * layers
    prod = sum(2 * n * (4 * e * e + 2 * e * inner) for n in lens) * layers
    return float(attn), float(prod)


def measure(bert: Bert, texts: list[str], length: int, rounds: int, cpu: bool) -> dict:
    clock = time.thread_time if cpu else time.perf_counter
    totals, kernels = [], []
    bert.encode(texts, max_length=length)  # warm
    for _ in range(rounds):
        spent = [0.0]
        with timed_kernels(clock, spent):
            t0 = clock()
            bert.encode(texts, max_length=length, batch_size=32)
            totals.append(clock() - t0)
        kernels.append(spent[0])
    attn_f, prod_f = flops(bert, texts, length)
    total, kernel = statistics.median(totals), statistics.median(kernels)
    time_share = kernel / total
    flop_share = attn_f / (attn_f + prod_f)
    return {"total_s": total, "attention_s": kernel, "time_share": time_share,
            "flop_share": flop_share, "ratio": time_share / flop_share}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paragraphs", type=int, default=24)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="sdpa,varlen,math")
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = torch.get_num_threads() == 1
    print(json.dumps(environment(), indent=1))
    texts = stdlib_paragraph_corpus(args.paragraphs)
    print(f"\n{len(texts)} paragraphs at <= {args.length} tokens, {torch.get_num_threads()} "
          f"thread(s), {'CPU' if cpu else 'wall'} seconds, median of {args.rounds}")  # fmt: skip
    print(f"{'dtype':<10}{'backend':<9}{'encode s':>9}{'attn s':>8}{'time %':>8}{'FLOP %':>8}"
          f"{'ratio':>7}  (target <= 1.5)")  # fmt: skip
    for dtype in args.dtypes.split(","):
        for backend in args.backends.split(","):
            bert = Bert.load(dtype=dtype, backend=backend)
            r = measure(bert, texts, args.length, args.rounds, cpu)
            print(f"{dtype:<10}{backend:<9}{r['total_s']:>9.3f}{r['attention_s']:>8.3f}"
                  f"{r['time_share']:>8.1%}{r['flop_share']:>8.1%}{r['ratio']:>7.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
