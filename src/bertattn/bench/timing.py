"""Fair timing: peers interleaved round by round, after warm-up, medians reported."""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..runtime.cpu import cpu_capability, cpu_name
from ..runtime.threads import cpu_budget

__all__ = ["Timer", "cpu_capability", "environment", "interleaved_medians"]


@dataclass
class Timer:
    """Seconds per call of each named function, measured interleaved."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(
    fns: dict[str, Callable[[], object]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: torch.device | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Timer:
    """Run every function ``warmup`` times, then ``repeats`` rounds of one call each: the first
    round in the given order, each later one in a shuffled order (seeded by the round, so runs
    repeat).

    Interleaving spreads a shared machine's noise over all peers instead of one of them; the
    shuffle spreads what a peer leaves behind (another runtime's threads still spinning after
    its call, a CPU slowed by its AMX work) over all peers instead of the one that always
    follows it (rotating the order would not: it keeps each peer's predecessor). ``clock``:
    wall time by default; ``time.process_time`` on a shared machine at one thread (a call is
    not charged for time spent waiting for a core).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    timer = Timer({name: [] for name in fns})
    for fn in fns.values():
        for _ in range(warmup):
            fn()
        _sync(device)
    names = list(fns)
    for r in range(repeats):
        for name in names if r == 0 else random.Random(r).sample(names, len(names)):
            fn = fns[name]
            _sync(device)
            start = clock()
            fn()
            _sync(device)
            timer.samples[name].append(clock() - start)
    return timer


def environment() -> dict[str, object]:
    """What the numbers were measured on, with the CPU's vector capability (see
    :func:`cpu_capability`), whether its bf16 matrix products are native or emulated, and the
    dtype ``dtype="auto"`` picks on this CPU with its reason (:func:`bertattn.choose_dtype`),
    and the library that computes float32 products here and why
    (:func:`bertattn.attention.gemm.describe`), and what ``dtype="int8"`` gets here: the form
    its products run in, or why it is refused (:func:`bertattn.encoder.int8.verdict`)."""
    from ..attention import gemm
    from ..encoder.auto_dtype import choose_dtype
    from ..encoder.int8 import verdict as int8_verdict

    cap = cpu_capability()
    auto = choose_dtype("cpu")
    gemm.choices()  # decided (timed once per machine, or the cache's answer) if not yet
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "usable_cpus": cpu_budget().describe(),
        "machine": platform.machine(),
        "processor": cpu_name(),
        "cpu_capability": cap["capability"],
        "bf16_matmul": cap["bf16_matmul"],
        "auto_dtype": auto.name,
        "auto_dtype_reason": auto.reason,
        "float32_products": gemm.describe(),
        "int8": int8_verdict(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def auto_line(env: dict[str, object] | None = None) -> str:
    """One line for a benchmark's header: what ``dtype="auto"`` picks here and why, and which
    library computes the float32 products (``env``: :func:`environment`'s, or measured now)."""
    env = environment() if env is None else env
    return f"auto: {env['auto_dtype']} ({env['auto_dtype_reason']}); {env['float32_products']}"
