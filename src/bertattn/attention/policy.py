"""The measured dispatch policy: which kernel ``auto`` runs, per device, dtype and size class.

One table, :data:`TABLE`, read by :func:`bertattn.attention.dispatch.choose_backend`. Each
:class:`Rule` says, for attention calls that need no weights (``need_weights=True`` always runs
``math``, the only backend that returns them):

* ``kernel``: the faster padded kernel, ``"sdpa"`` (fused ``scaled_dot_product_attention``) or
  ``"math"`` (matmul + softmax + matmul, the reference);
* ``varlen_min_pad``: an encoder packs its padded batch (backend ``varlen``) when at least this
  share of it is padding; ``None`` = never pack.

The first rule whose ``device``, ``dtype`` and ``size`` match wins (``"*"`` matches anything).
The size class is the key length L: see :data:`SIZE_CLASSES`. ``math`` is used by ``auto`` for
inference only (no dropout): the table was measured without dropout.

Regenerate the CPU rows on a machine: ``python -m benchmarks.dispatch`` measures the candidates
on every size class and prints the new table as Python source (``--json FILE`` also writes it);
``bertattn bench --dispatch`` prints the table in use, ``--measure`` re-measures it, short.

Override, for an experiment or a test: :func:`use_table` (a context manager) or assign a new
tuple to ``policy.TABLE``; the table is an immutable tuple, so ``auto`` sees every change
(its memo is keyed on the table object).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = [
    "Rule",
    "SIZE_CLASSES",
    "TABLE",
    "format_table",
    "lookup",
    "lookup_class",
    "size_class",
    "use_table",
]

#: ``(name, largest key length)`` in increasing order; the last class takes every longer L.
SIZE_CLASSES: tuple[tuple[str, int], ...] = (
    ("tiny", 32),
    ("short", 128),
    ("medium", 512),
    ("long", 1 << 62),
)

#: the threshold measured with ``python -m benchmarks.varlen_threshold`` (MiniLM, B=32, L=128,
#: 2-core CPU): packing was even at 0-5% padding (0.97-1.05x), 1.05x at 10%, 1.22x at 20% and
#: 1.68x at 40%.
CPU_VARLEN_MIN_PAD = 0.10


@dataclass(frozen=True)
class Rule:
    """One row of the policy table (see the module docstring)."""

    device: str  # "cpu", "cuda", ... or "*"
    dtype: str  # "float32", "bfloat16", "float16", "float64" or "*"
    size: str  # a SIZE_CLASSES name or "*"
    kernel: str  # "sdpa" | "math": the padded kernel without weights
    varlen_min_pad: float | None  # pack from this padding share; None: never
    source: str = ""  # where the row was measured, or why it was not

    def matches(self, device: str, dtype: str, size: str) -> bool:
        return (
            self.device in ("*", device) and self.dtype in ("*", dtype) and self.size in ("*", size)
        )


_CPU_FP32 = (
    "kernel measured on a 2-core Intel Xeon (AVX512, bf16 emulated), torch 2.13, fp32: math "
    "1.2-7x slower than sdpa in every class (benchmarks/dispatch.py); varlen threshold: "
    "benchmarks/varlen_threshold.py (MiniLM B=32 L=128)"
)

# BEGIN GENERATED TABLE (python -m benchmarks.dispatch)
TABLE: tuple[Rule, ...] = (
    Rule(
        "cuda",
        "*",
        "*",
        "sdpa",
        None,
        "measured on an H200, not here (benchmarks/gpu.py): BERT-base B=16 is launch-bound, "
        "packing no faster; padded fused SDPA",
    ),
    Rule("cpu", "float32", "tiny", "sdpa", CPU_VARLEN_MIN_PAD, _CPU_FP32),
    Rule("cpu", "float32", "short", "sdpa", CPU_VARLEN_MIN_PAD, _CPU_FP32),
    Rule("cpu", "float32", "medium", "sdpa", CPU_VARLEN_MIN_PAD, _CPU_FP32),
    Rule("cpu", "float32", "long", "sdpa", CPU_VARLEN_MIN_PAD, _CPU_FP32),
    Rule(
        "cpu",
        "*",
        "*",
        "sdpa",
        CPU_VARLEN_MIN_PAD,
        "not measured: bf16/fp16 matmuls are emulated on the measuring CPU (no AVX512_BF16 / "
        "AMX); the fp32 rule is kept",
    ),
    Rule("*", "*", "*", "sdpa", None, "default for other devices: not measured"),
)
# END GENERATED TABLE


def size_class(key_len: int | None) -> str:
    """The :data:`SIZE_CLASSES` name of a key length (``"*"`` when unknown)."""
    if key_len is None:
        return "*"
    for name, top in SIZE_CLASSES:
        if key_len <= top:
            return name
    return SIZE_CLASSES[-1][0]


def dtype_name(dtype: torch.dtype | str | None) -> str:
    """``torch.float32`` -> ``"float32"``; None -> ``"*"``. (No cache: a module-level dict
    read while torch.compile traces would become a guard, and every new entry a recompile.)"""
    if dtype is None:
        return "*"
    return str(dtype).replace("torch.", "")


_FALLBACK = Rule("*", "*", "*", "sdpa", None, "no rule matched: fused SDPA")


def lookup(
    device: str,
    dtype: torch.dtype | str | None,
    key_len: int | None,
    table: tuple[Rule, ...] | None = None,
) -> Rule:
    """The first rule of ``table`` (default: :data:`TABLE`) matching the call."""
    return lookup_class(device, dtype, size_class(key_len), table)


def lookup_class(
    device: str,
    dtype: torch.dtype | str | None,
    size: str,
    table: tuple[Rule, ...] | None = None,
) -> Rule:
    """The first rule matching a size class given by name (``"*"``: unknown)."""
    rules = TABLE if table is None else table
    dt = dtype_name(dtype)
    for rule in rules:
        if rule.matches(device, dt, size):
            return rule
    return _FALLBACK


@contextlib.contextmanager
def use_table(table: tuple[Rule, ...]) -> Iterator[tuple[Rule, ...]]:
    """Run the block with another policy table (``auto`` follows it), then restore."""
    global TABLE
    old, TABLE = TABLE, tuple(table)
    try:
        yield TABLE
    finally:
        TABLE = old


def format_table(table: tuple[Rule, ...] | None = None) -> str:
    """The table as aligned text, one rule a line, first match wins."""
    rules = TABLE if table is None else table
    bounds, low = [], 0
    for name, top in SIZE_CLASSES:
        span = f"L>{low}" if top >= 1 << 62 else f"L<={top}"
        bounds.append(f"{name} {span}")
        low = top
    lines = [
        "attention dispatch policy (first match wins; need_weights=True always runs math)",
        "size classes by key length: " + ", ".join(bounds),
        f"{'device':<7}{'dtype':<9}{'size':<8}{'kernel':<7}{'varlen from':<12}source",
    ]
    for r in rules:
        pad = "never" if r.varlen_min_pad is None else f">={r.varlen_min_pad:.0%} pad"
        lines.append(f"{r.device:<7}{r.dtype:<9}{r.size:<8}{r.kernel:<7}{pad:<12}{r.source}")
    return "\n".join(lines)


def table_source(table: tuple[Rule, ...]) -> str:
    """``table`` as the Python source of a ``TABLE = (...)`` assignment (for regeneration)."""
    lines = ["TABLE: tuple[Rule, ...] = ("]
    for r in table:
        lines.append("    Rule(")
        lines.append(
            f"        {r.device!r}, {r.dtype!r}, {r.size!r}, {r.kernel!r}, {r.varlen_min_pad!r},"
        )
        for chunk in _chunks(r.source, 80):
            lines.append(f"        {chunk!r}")
        lines.append("    ),")
    lines.append(")")
    return "\n".join(lines)


def _chunks(text: str, width: int) -> list[str]:
    """``text`` cut at spaces into pieces of at most about ``width`` characters (kept whole:
    the pieces concatenate back to ``text``)."""
    out, cur = [], ""
    for word in text.split(" "):
        piece = word if not cur else " " + word
        if cur and len(cur) + len(piece) > width:
            out.append(cur)
            cur = " " + word
        else:
            cur += piece
    out.append(cur)
    return out
