"""`bertattn bench --encode`: how fast ``Bert.encode`` runs on this machine, in texts per
second, for a model (default: the default model) in each dtype this CPU offers, beside what
``dtype="auto"`` picks here and why.

The dtypes: float32 always; bfloat16 where the CPU multiplies bf16 matrices natively (where it
is emulated it is slower than float32, and is listed as not timed); int8 where
``Bert.load(dtype="int8")`` takes it (it refuses, naming why, on a CPU without VNNI or AMX or
where it falls short of float32: listed with that reason). Each dtype is loaded, warmed up on
a few texts, then timed for ``repeats`` rounds of encoding the same texts; the median round
gives the rate.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "EncodeResult",
    "as_json",
    "auto_choice",
    "bench_texts",
    "format_encode_table",
    "offered_dtypes",
    "run_encode_bench",
]

#: sentences of a few lengths (6 to 40 tokens), cycled to make the benchmark's texts
_SENTENCES = (
    "The cat sat on the mat.",
    "Attention weighs every token of the sentence against every other one.",
    "Paris is the capital and the largest city of France, on the river Seine.",
    "A sentence encoder maps a text to one vector, so that texts with similar meanings lie "
    "close together and can be compared with a single dot product.",
    "It slept.",
    "The animal didn't cross the street because it was too tired to walk any further that day.",
)

#: a progress callback: one short line at a time (the command line prints it on stderr)
Progress = Callable[[str], object]


@dataclass
class EncodeResult:
    """One dtype's row: ``texts_per_s`` from the median of ``seconds`` (one per round), or
    None with ``note`` saying why it was not timed."""

    dtype: str
    texts: int
    seconds: list[float]
    texts_per_s: float | None
    note: str = ""


def bench_texts(n: int) -> list[str]:
    """``n`` texts of a few lengths (each made distinct by its number)."""
    if n < 1:
        raise ValueError(f"the encode benchmark needs at least one text, got {n}.")
    return [f"{_SENTENCES[i % len(_SENTENCES)]} ({i})" for i in range(n)]


def offered_dtypes() -> list[tuple[str, str]]:
    """``(dtype, why not)`` for float32, bfloat16 and int8: an empty reason when it is timed."""
    from ..runtime.cpu import cpu_capability

    native = cpu_capability()["bf16_matmul"] == "native"
    bf16 = "" if native else "not timed: bf16 is emulated on this CPU (slower than float32)"
    return [("float32", ""), ("bfloat16", bf16), ("int8", "")]


def run_encode_bench(
    model: str | Path | None = None,
    *,
    texts: int = 256,
    repeats: int = 5,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> list[EncodeResult]:
    """Every offered dtype's rate on ``texts`` texts (see the module docstring)."""
    say = progress or (lambda line: None)
    batch = bench_texts(texts)
    results = []
    for dtype, skip in offered_dtypes():
        if skip:
            results.append(EncodeResult(dtype, texts, [], None, skip))
            say(f"{dtype}: {skip}")
            continue
        results.append(_time_dtype(model, dtype, batch, repeats, batch_size, say))
    return results


def _time_dtype(
    model: str | Path | None,
    dtype: str,
    texts: list[str],
    repeats: int,
    batch_size: int,
    say: Progress,
) -> EncodeResult:
    """Load ``model`` in ``dtype``, warm it up, time ``repeats`` rounds of encoding ``texts``.
    A dtype the model or CPU refuses (a ``ValueError`` naming why) is a row with that note."""
    import warnings

    from ..encoder.pipeline import Bert

    say(f"{dtype}: loading the model")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the notices of loading are not the benchmark's
            bert = Bert.load(model, dtype=dtype)
            bert.encode(texts[:batch_size], batch_size=batch_size)  # warm-up
    except ValueError as exc:
        note = "refused here: " + " ".join(str(exc).split())
        say(f"{dtype}: {note}")
        return EncodeResult(dtype, len(texts), [], None, note)
    seconds = []
    for r in range(repeats):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bert.encode(texts, batch_size=batch_size)
        seconds.append(time.perf_counter() - start)
        say(f"{dtype}: round {r + 1}/{repeats}, {len(texts) / seconds[-1]:.1f} texts/s")
    return EncodeResult(dtype, len(texts), seconds, len(texts) / statistics.median(seconds))


def auto_choice(model: str | Path | None = None) -> tuple[str, str]:
    """``(dtype, why)``: what ``Bert.load(model, dtype="auto")`` picks here, at this process's
    thread count and the model's widths (timed once per machine, or the kept timing)."""
    import torch

    from ..encoder.auto_dtype import choose_dtype
    from ..encoder.folder import resolve_model

    config = resolve_model(model).config
    widths = (config.hidden_size, config.intermediate_size)
    choice = choose_dtype("cpu", threads=torch.get_num_threads(), widths=widths)
    return choice.name, choice.reason


def format_encode_table(results: list[EncodeResult]) -> str:
    """dtype, texts/s, ms per text and the rate over float32's, one row per dtype."""
    base = next((r.texts_per_s for r in results if r.dtype == "float32"), None)
    lines = [f"{'dtype':<10}{'texts/s':>10}{'ms/text':>10}{'vs fp32':>9}"]
    for r in results:
        if r.texts_per_s is None:
            lines.append(f"{r.dtype:<10}  {r.note}")
            continue
        ratio = f"{r.texts_per_s / base:.2f}x" if base else ""
        lines.append(
            f"{r.dtype:<10}{r.texts_per_s:>10.1f}{1e3 / r.texts_per_s:>10.2f}{ratio:>9}"
        )
    return "\n".join(lines)


def as_json(results: list[EncodeResult]) -> list[dict[str, object]]:
    """The rows as JSON-ready dicts."""
    return [asdict(r) for r in results]
