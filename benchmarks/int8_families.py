"""int8 on the families built from blocks: ``Bert.load(dtype="int8")``'s quantization of a
ModernBERT, GTE, Qwen3 or EuroBERT model against the same model in float32 and against
transformers' native class (sdpa, float32), on short texts and 256-token passages.

    python -m benchmarks.int8_families [--family gte,modernbert] [--layers 4] [--short 64]
                                       [--passages 16] [--rounds 3] [--threads 1] [--cpu-time]
                                       [--breakdown] [--unfused]

Random weights (seeded) at each family's released base size (benchmarks.modern,
benchmarks.embedders), cut to ``--layers`` layers (0: all; the ratio is per layer). The int8
form is the one the product timing keeps on this CPU (a refusal is printed with its numbers,
and then ``--form u8s7`` times the 7-bit form anyway, exact on every CPU). Random weights say
nothing of fidelity on real text: the cosine printed is only a check that the model ran.
``--cpu-time`` times each call in this process's CPU seconds (on a shared machine a call
is not charged for time spent waiting for a core); otherwise wall time. ``--breakdown``: where
an int8 passage call's CPU seconds go (the int8 products, the attention kernels, the rest of
the layers, outside the layers), the median call of ``--rounds``. Target (issue 55):
int8 ModernBERT-base and GTE-base >= 2x transformers float32 on passages.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from bertattn import Bert
from bertattn.attention import backends
from bertattn.bench import environment, interleaved_medians
from bertattn.blocks.contract import LayerStack
from bertattn.encoder import int8
from bertattn.encoder.int8_forms import U8_S7_F32

from . import embedders, modern
from .corpus import stdlib_docstring_corpus, stdlib_paragraph_corpus


def make_folder(family: str, root: Path, layers: int) -> Path:
    if family in embedders.SHAPES:
        return embedders.make_folder(family, root, layers)
    return modern.make_folder(family, root, layers)


def timed(peers: dict[str, Callable[[], object]], rounds: int, cpu: bool) -> dict[str, float]:
    """Median seconds of each peer, interleaved round by round after one warm-up call each."""
    clock = time.process_time if cpu else time.perf_counter
    timer = interleaved_medians(peers, repeats=rounds, warmup=1, clock=clock)
    return {k: timer.median(k) for k in peers}


def quantized(folder: Path, form: str) -> tuple[Bert, str]:
    bert = Bert.load(folder, dtype="float32")
    if form == "u8s7":
        real = int8.check_speed
        int8.check_speed = lambda: int8.Speed(0, 0, 0, 0.0, 0.0, "", 1, form=U8_S7_F32)  # type: ignore[assignment]
        try:
            int8.quantize_model(bert)
        finally:
            int8.check_speed = real  # type: ignore[assignment]
        return bert, f"{U8_S7_F32} (forced)"
    int8.quantize_model(bert)
    return bert, str(bert.model.int8_speed.form)


def _timed_into(acc: dict[str, float], key: str, fn: Callable) -> Callable:
    def call(*args: object, **kwargs: object) -> object:
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.process_time() - start

    return call


@contextmanager
def accounted(acc: dict[str, float]) -> Iterator[None]:
    """Inside the block, CPU seconds are added to ``acc``: ``products`` (int8 matmuls),
    ``attention`` (every attention backend's kernel), ``layers`` (the encoder stack)."""
    saved = [(int8.Int8Linear, "matmul", int8.Int8Linear.matmul)]
    saved += [(LayerStack, n, getattr(LayerStack, n)) for n in ("forward", "forward_packed")]
    specs = [(spec, spec.fn) for spec in backends.BACKENDS.values()]
    int8.Int8Linear.matmul = _timed_into(acc, "products", int8.Int8Linear.matmul)
    for n in ("forward", "forward_packed"):
        setattr(LayerStack, n, _timed_into(acc, "layers", getattr(LayerStack, n)))
    for spec, fn in specs:
        object.__setattr__(spec, "fn", _timed_into(acc, "attention", fn))
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        for spec, fn in specs:
            object.__setattr__(spec, "fn", fn)


def print_breakdown(call: Callable[[], object], rounds: int) -> None:
    """Where ``call``'s CPU seconds go, the call of median total of ``rounds``."""
    runs = []
    for _ in range(rounds):
        acc = dict.fromkeys(("products", "attention", "layers"), 0.0)
        with accounted(acc):
            start = time.process_time()
            call()
            runs.append((time.process_time() - start, acc))
    total, acc = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    inside = acc["layers"] - acc["products"] - acc["attention"]
    print(f"  int8 call {total:.3f} CPU s: products {acc['products']:.3f}, attention "
          f"{acc['attention']:.3f}, the rest of the layers {inside:.3f}, outside the layers "
          f"{total - acc['layers']:.3f}")  # fmt: skip


def unfused(call: Callable[[], object], bert: Bert) -> Callable[[], object]:
    """``call`` with the fused steps of ``bert``'s int8 blocks switched off (each block's
    ``fast_path`` unset for the call, then given back): the products one by one, as before the
    fusion, on the same model and weights."""
    blocks = [m for m in bert.model.modules() if "fast_path" in vars(m)]

    def run() -> object:
        saved = [vars(b)["fast_path"] for b in blocks]
        for b in blocks:
            b.fast_path = None
        try:
            return call()
        finally:
            for b, fast in zip(blocks, saved, strict=True):
                b.fast_path = fast

    return run


def run_family(family: str, root: Path, args: argparse.Namespace) -> None:
    folder = make_folder(family, root, args.layers)
    try:
        q, form = quantized(folder, args.form)
    except ValueError as exc:
        print(f"\n{family}: int8 refused here: {exc}")
        return
    f32 = Bert.load(folder, dtype="float32")
    for name, texts, length in (
        ("short texts", stdlib_docstring_corpus(args.short), 128),
        ("256-token passages", stdlib_paragraph_corpus(args.passages), 256),
    ):
        hf = modern.transformers_encoder(folder, length)

        def enc(b: Bert, texts: list[str] = texts, length: int = length) -> Callable[[], object]:
            return lambda: b.encode(texts, batch_size=32, pooling="mean", normalize=True,
                                    max_length=length, convert_to_tensor=True)  # fmt: skip

        peers = {"int8": enc(q), "float32": enc(f32),
                 "transformers fp32": lambda hf=hf, texts=texts: hf(texts)}  # fmt: skip
        if args.unfused:
            peers["int8 unfused"] = unfused(peers["int8"], q)
        secs = timed(peers, args.rounds, args.cpu_time)
        cos = float((enc(q)() * enc(f32)()).sum(1).min())
        clock = "CPU" if args.cpu_time else "wall"
        print(f"\n{family}, {name}, {len(texts)} texts, int8 as {form} (min cosine to "
              f"float32 {cos:.4f}; {clock} s, median of {args.rounds})")  # fmt: skip
        for peer, s in secs.items():
            ratio = "" if peer == "int8" else f"  int8 {s / secs['int8']:.2f}x"
            print(f"  {peer:<20}{s:>9.3f}{ratio}")
        if args.breakdown:
            print_breakdown(peers["int8"], args.rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="gte,modernbert")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--short", type=int, default=64)
    p.add_argument("--passages", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="default: torch's count")
    p.add_argument("--cpu-time", action="store_true")
    p.add_argument("--form", choices=("timed", "u8s7"), default="timed")
    p.add_argument("--breakdown", action="store_true", help="where int8's CPU seconds go")
    p.add_argument("--unfused", action="store_true",
                   help="also the same int8 model with the blocks' fused steps off")  # fmt: skip
    args = p.parse_args(argv)
    known = set(modern.BASE) | set(embedders.SHAPES)
    unknown = [f for f in args.family.split(",") if f not in known]
    if unknown:
        p.error(f"unknown --family {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(environment(), indent=1))
    with tempfile.TemporaryDirectory(prefix="bertattn-int8-families-") as tmp:
        for family in args.family.split(","):
            run_family(family, Path(tmp), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
