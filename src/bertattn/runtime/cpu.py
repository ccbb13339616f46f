"""What this CPU can do, from /proc/cpuinfo and torch: its vector level (AMX / AVX512_BF16 /
AVX512 / AVX2 / default) and whether its bf16 matrix products are native or emulated.

Library code (``dtype="auto"``, :mod:`bertattn.encoder.auto_dtype`) and the benchmarks
(:func:`bertattn.bench.environment`) read the CPU here, so both say the same of it.
"""

from __future__ import annotations

import platform

import torch

__all__ = [
    "ZEN4_FAMILY",
    "cpu_capability",
    "cpu_family",
    "cpu_flags",
    "cpu_name",
    "cpu_vendor",
    "is_zen4",
]

#: from the highest: the name, and the /proc/cpuinfo flag that gives it
_LEVELS = (("AMX", "amx_bf16"), ("AVX512_BF16", "avx512_bf16"), ("AVX512", "avx512f"))


def cpu_capability(flags: set[str] | None = None, torch_capability: str | None = None) -> dict:
    """The highest of AMX / AVX512_BF16 / AVX512 / AVX2 / default on this CPU.

    From ``torch.backends.cpu.get_cpu_capability()`` (the kernels torch dispatches to: DEFAULT,
    AVX2, AVX512, ...) and the /proc/cpuinfo flags ``amx_bf16`` / ``avx512_bf16``, which torch's
    string does not tell (``flags``: those flags, default :func:`cpu_flags`).
    ``bf16_matmul`` is ``"native"`` with one of those two flags, else ``"emulated"`` (oneDNN
    converts to fp32: bf16 runs slower than fp32; such numbers say nothing of a bf16-capable
    CPU). Returns ``capability``, ``bf16_matmul``, ``torch_capability`` and the relevant
    ``flags`` found.
    """
    if flags is None:
        flags = cpu_flags()
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


def _cpuinfo_field(name: str) -> str | None:
    """The value of the first ``name`` line of /proc/cpuinfo (None: no such line, or no file)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The ``flags`` of /proc/cpuinfo (an empty set where there is none: not Linux, not x86)."""
    return set((_cpuinfo_field("flags") or "").split())


def cpu_vendor() -> str:
    """The ``vendor_id`` of /proc/cpuinfo (``"GenuineIntel"``, ``"AuthenticAMD"``, ...; ``""``
    where there is none)."""
    return _cpuinfo_field("vendor_id") or ""


def cpu_family() -> int | None:
    """The ``cpu family`` of /proc/cpuinfo (AMD: 25 is Zen 3 and Zen 4, 26 is Zen 5; None where
    there is none or it is not a number)."""
    value = _cpuinfo_field("cpu family")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


#: AMD's ``cpu family`` of Zen 3 and Zen 4; of the two only Zen 4 has AVX-512, which it runs on
#: 256-bit units (measured on a 2-core Zen 4 EPYC, 2026-12-06: bfloat16 products 1.77x float32,
#: oneDNN's float32 AVX-512 kernels only 1.03-1.13x MKL's AVX2 ones on batches)
ZEN4_FAMILY = 25


def is_zen4(vendor: str | None, family: int | None, flags: set[str]) -> bool:
    """Whether ``vendor`` / ``family`` / ``flags`` (:func:`cpu_vendor`, :func:`cpu_family`,
    :func:`cpu_flags`, or given) describe an AMD Zen 4: family 25 with AVX-512."""
    return vendor == "AuthenticAMD" and family == ZEN4_FAMILY and "avx512f" in flags


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo, else :func:`platform.processor`)."""
    return _cpuinfo_field("model name") or platform.processor()
