"""Fair timing: peers interleaved round by round, after warm-up, medians reported."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..threads import cpu_budget


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
) -> Timer:
    """Run every function ``warmup`` times, then ``repeats`` rounds of one call each, in turn.

    Interleaving spreads a shared machine's noise over all peers instead of one of them.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    timer = Timer({name: [] for name in fns})
    for fn in fns.values():
        for _ in range(warmup):
            fn()
        _sync(device)
    for _ in range(repeats):
        for name, fn in fns.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            timer.samples[name].append(time.perf_counter() - start)
    return timer


def environment() -> dict[str, object]:
    """What the numbers were measured on, with the CPU's vector capability (see
    :func:`cpu_capability`) and whether its bf16 matrix products are native or emulated."""
    cap = cpu_capability()
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "usable_cpus": cpu_budget().describe(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cpu_capability": cap["capability"],
        "bf16_matmul": cap["bf16_matmul"],
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


#: from the highest: the name, and the /proc/cpuinfo flag that gives it
_LEVELS = (("AMX", "amx_bf16"), ("AVX512_BF16", "avx512_bf16"), ("AVX512", "avx512f"))


def cpu_capability(flags: set[str] | None = None, torch_capability: str | None = None) -> dict:
    """The highest of AMX / AVX512_BF16 / AVX512 / AVX2 / default on this CPU.

    From ``torch.backends.cpu.get_cpu_capability()`` (the kernels torch dispatches to: DEFAULT,
    AVX2, AVX512, ...) and the /proc/cpuinfo flags ``amx_bf16`` / ``avx512_bf16``, which torch's
    string does not tell. ``bf16_matmul`` is ``"native"`` with one of those two flags, else
    ``"emulated"`` (oneDNN converts to fp32: bf16 runs slower than fp32; such numbers say
    nothing of a bf16-capable CPU). Returns ``capability``, ``bf16_matmul``,
    ``torch_capability`` and the relevant ``flags`` found.
    """
    if flags is None:
        flags = _cpu_flags()
    if torch_capability is None:
        try:
            torch_capability = str(torch.backends.cpu.get_cpu_capability())
        except Exception:  # pragma: no cover - very old torch
            torch_capability = "unknown"
    tc = torch_capability.upper()
    level = "default"
    for name, flag in _LEVELS:
        if flag in flags or (name == "AVX512" and tc.startswith("AVX512")):
            level = name
            break
    else:
        if "avx2" in flags or tc.startswith("AVX2"):
            level = "AVX2"
    native = bool({"amx_bf16", "avx512_bf16"} & flags)
    wanted = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
    return {
        "capability": level,
        "bf16_matmul": "native" if native else "emulated",
        "torch_capability": torch_capability,
        "flags": [f for f in wanted if f in flags],
    }


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
