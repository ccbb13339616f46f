"""Measure the dispatch policy's candidates on this machine and derive the CPU table rows.

Two measurements per size class (:data:`bertattn.attention.policy.SIZE_CLASSES`), fp32, eval,
no dropout, peers interleaved round by round, medians:

* kernels: ``math`` without weights (matmul + softmax + matmul) against fused ``sdpa`` on
  ``(B, H=12, L, D=32)`` (MiniLM's heads) with a padding bias (a quarter of the keys masked);
  ``math`` wins a class only when it is faster by :data:`MARGIN` on every shape of the class;
* packing: a 2-layer MiniLM-sized random :class:`~bertattn.BertModel` run ``varlen`` against
  ``sdpa`` on padded batches with a growing share of padding; the class's threshold is the
  smallest measured share from which packing is at least as fast at every larger share
  (None when it never is).

``python -m benchmarks.dispatch`` runs everything and prints the table as Python source;
``bertattn bench --dispatch --measure`` runs the quick variant.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..attention import policy
from ..attention.backends import math_attention, sdpa_attention
from .timing import environment, interleaved_medians

#: ``math`` must beat ``sdpa`` by this share on every shape of a class to be chosen there
MARGIN = 0.10

#: ``(B, H, L, D)`` measured per size class; the quick variant takes the first of each
KERNEL_SHAPES: dict[str, list[tuple[int, int, int, int]]] = {
    "tiny": [(1, 12, 16, 32), (8, 12, 16, 32), (32, 12, 16, 32)],
    "short": [(1, 12, 128, 32), (8, 12, 128, 32)],
    "medium": [(1, 12, 512, 32), (4, 12, 512, 32)],
    "long": [(1, 12, 1024, 32)],
}

#: ``(batch, seq_len)`` of the packing measurement per size class (long: not measured, the
#: per-sequence loop only gets cheaper relative to attention as L grows)
VARLEN_SHAPES: dict[str, tuple[int, int]] = {
    "tiny": (32, 32),
    "short": (32, 128),
    "medium": (4, 512),
}
PAD_SHARES = (0.05, 0.1, 0.2, 0.4)
QUICK_PAD_SHARES = (0.1, 0.4)


@dataclass
class DispatchMeasurement:
    """What :func:`measure` found; :func:`derive_table` turns it into table rows."""

    kernels: list[dict[str, object]] = field(default_factory=list)
    varlen: list[dict[str, object]] = field(default_factory=list)
    environment: dict[str, object] = field(default_factory=dict)
    quick: bool = False


def _calls_per_sample(fn, target_s: float = 0.004) -> int:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    one = max(time.perf_counter() - start, 1e-6)
    return max(1, min(2000, int(target_s / one)))


def _loop(fn, n: int):  # type: ignore[no-untyped-def]
    def run() -> None:
        for _ in range(n):
            fn()

    return run


def measure_kernels(quick: bool = False, repeats: int = 5) -> list[dict[str, object]]:
    """math vs sdpa, seconds per call, on every shape of :data:`KERNEL_SHAPES`."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for size, shapes in KERNEL_SHAPES.items():
            for b, h, length, d in shapes[:1] if quick else shapes:
                q, k, v = (torch.randn(b, h, length, d, generator=gen) for _ in range(3))
                bias = torch.zeros(b, 1, 1, length)
                bias[..., length - length // 4 :] = float("-inf")  # the last quarter: padding

                def run_math(q=q, k=k, v=v, bias=bias) -> object:
                    return math_attention(q, k, v, bias, dropout_p=0.0, need_weights=False)

                def run_sdpa(q=q, k=k, v=v, bias=bias) -> object:
                    return sdpa_attention(q, k, v, bias, dropout_p=0.0, need_weights=False)

                run_sdpa()  # warm
                n = _calls_per_sample(run_sdpa)
                t = interleaved_medians(
                    {"math": _loop(run_math, n), "sdpa": _loop(run_sdpa, n)},
                    repeats=repeats,
                    warmup=1,
                )
                rows.append(
                    {
                        "size": size,
                        "shape": (b, h, length, d),
                        "math_s": t.median("math") / n,
                        "sdpa_s": t.median("sdpa") / n,
                        "math_over_sdpa": t.median("math") / t.median("sdpa"),
                    }
                )
    return rows


def _random_encoders(max_len: int):  # type: ignore[no-untyped-def]
    from ..encoder.config import BertConfig
    from ..encoder.model import BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=2,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=max(512, max_len),
    )
    sdpa = BertModel(cfg, backend="sdpa").eval()
    varlen = BertModel(cfg, backend="varlen").eval()
    varlen.load_state_dict(sdpa.state_dict())
    return sdpa, varlen


def measure_varlen(quick: bool = False, repeats: int = 5) -> list[dict[str, object]]:
    """varlen vs sdpa on padded batches: one row per size class and padding share."""
    shares = QUICK_PAD_SHARES if quick else PAD_SHARES
    classes = ["short"] if quick else list(VARLEN_SHAPES)
    sdpa, varlen = _random_encoders(max(VARLEN_SHAPES[c][1] for c in classes))
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for size in classes:
            b, length = VARLEN_SHAPES[size]
            for share in shares:
                # lengths spread evenly so that about `share` of the batch is padding, longest = L
                short = max(1, int(round(length * (1 - 2 * share))))
                lengths = torch.linspace(short, length, b).round().long()
                ids = torch.randint(1000, 20000, (b, length), generator=gen)
                mask = (torch.arange(length)[None] < lengths[:, None]).long()
                t = interleaved_medians(
                    {
                        "varlen": lambda i=ids, m=mask: varlen(i, m),
                        "sdpa": lambda i=ids, m=mask: sdpa(i, m),
                    },
                    repeats=repeats,
                    warmup=1,
                )
                rows.append(
                    {
                        "size": size,
                        "batch": b,
                        "seq_len": length,
                        "pad_fraction": 1 - float(lengths.sum()) / (b * length),
                        "varlen_s": t.median("varlen"),
                        "sdpa_s": t.median("sdpa"),
                        "varlen_speedup": t.median("sdpa") / t.median("varlen"),
                    }
                )
    return rows


def measure(quick: bool = False, repeats: int = 5, varlen: bool = True) -> DispatchMeasurement:
    """Kernels (and, unless ``varlen=False``, packing) on every size class."""
    return DispatchMeasurement(
        kernels=measure_kernels(quick, repeats),
        varlen=measure_varlen(quick, repeats) if varlen else [],
        environment=environment(),
        quick=quick,
    )


def _threshold(rows: list[dict[str, object]]) -> float | None:
    """The smallest padding share from which packing is at least as fast at every larger one."""
    rows = sorted(rows, key=lambda r: float(r["pad_fraction"]))  # type: ignore[arg-type]
    best = None
    for r in reversed(rows):
        if float(r["varlen_speedup"]) < 1.0:  # type: ignore[arg-type]
            break
        best = round(float(r["pad_fraction"]), 2)  # type: ignore[arg-type]
    return best


def derive_table(
    m: DispatchMeasurement, base: tuple[policy.Rule, ...] | None = None
) -> tuple[policy.Rule, ...]:
    """The table with its ``cpu`` / ``float32`` rows replaced by what ``m`` measured.

    A size class keeps the base table's threshold where packing was not measured; the other
    rows (CUDA, other dtypes, the fallback) are kept as they are.
    """
    base = policy.TABLE if base is None else base
    env = m.environment
    where = (
        f"measured on {env.get('processor')} ({env.get('cpu_capability')}, bf16 matmul "
        f"{env.get('bf16_matmul')}), {env.get('threads')} threads, torch {env.get('torch')}, fp32"
        f"{' (quick)' if m.quick else ''}"
    )
    new_rows = []
    for size, _ in policy.SIZE_CLASSES:
        kern = [r for r in m.kernels if r["size"] == size]
        faster = bool(kern) and all(
            float(r["math_over_sdpa"]) <= 1.0 - MARGIN  # type: ignore[arg-type]
            for r in kern
        )
        packed = [r for r in m.varlen if r["size"] == size]
        old = policy.lookup("cpu", "float32", _class_len(size), base)
        threshold = _threshold(packed) if packed else old.varlen_min_pad
        note = "" if packed else "; varlen threshold kept, not measured for this class"
        new_rows.append(
            policy.Rule(
                "cpu", "float32", size, "math" if faster else "sdpa", threshold, where + note
            )
        )
    kept = [r for r in base if not (r.device == "cpu" and r.dtype == "float32")]
    cuda = [r for r in kept if r.device not in ("cpu", "*")]
    rest = [r for r in kept if r not in cuda]
    return tuple(cuda + new_rows + rest)


def _class_len(size: str) -> int:
    low = 0
    for name, top in policy.SIZE_CLASSES:
        if name == size:
            return min(top, low + 1)
        low = top
    raise ValueError(f"unknown size class {size!r}")


def format_measurement(m: DispatchMeasurement) -> str:
    """The measured numbers as aligned text."""
    lines = [f"kernels, fp32, no weights, 1/4 of the keys padded; {m.environment}"]
    lines.append(f"{'size':<8}{'B,H,L,D':<18}{'math us':>11}{'sdpa us':>11}{'math/sdpa':>11}")
    for r in m.kernels:
        shape = ",".join(str(s) for s in r["shape"])  # type: ignore[attr-defined]
        lines.append(
            f"{r['size']:<8}{shape:<18}{float(r['math_s']) * 1e6:>11.1f}"  # type: ignore[arg-type]
            f"{float(r['sdpa_s']) * 1e6:>11.1f}{float(r['math_over_sdpa']):>10.2f}x"  # type: ignore[arg-type]
        )
    lines.append(f"(math is chosen only when faster by {MARGIN:.0%} on every shape of a class)")
    if m.varlen:
        lines.append("packing: 2-layer MiniLM-sized encoder, varlen vs sdpa on the padded batch")
        lines.append(
            f"{'size':<8}{'B x L':<10}{'padding':>8}{'varlen ms':>11}{'sdpa ms':>9}{'varlen x':>10}"
        )
        for r in m.varlen:
            lines.append(
                f"{r['size']:<8}{str(r['batch']) + ' x ' + str(r['seq_len']):<10}"
                f"{float(r['pad_fraction']):>8.1%}{float(r['varlen_s']) * 1e3:>11.1f}"  # type: ignore[arg-type]
                f"{float(r['sdpa_s']) * 1e3:>9.1f}{float(r['varlen_speedup']):>9.2f}x"  # type: ignore[arg-type]
            )
    return "\n".join(lines)
