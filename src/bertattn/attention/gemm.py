"""Which library computes a float32 product on the CPU: MKL (``F.linear``) or oneDNN.

PyTorch's CPU builds send a float32 ``F.linear`` to MKL's ``sgemm``. MKL picks its kernels by
the CPU's vendor, and on AMD processors it leaves AVX-512 unused; oneDNN (also in every x86
build, as ``torch.ops.mkldnn._linear_pointwise``, the op ``torch.compile`` emits for CPU linear
layers) generates its kernels from the CPU's instruction set whoever made it. Measured on a
2-core AMD EPYC with AVX-512 (torch 2.13.0, 2 threads, MiniLM widths): oneDNN 2.0-2.3x MKL's
rate from 10 to 4,096 rows (2048^3: 393 against 188 GFLOP/s), and ``Bert.encode`` 1.7x on
paragraphs, 1.6x on short texts; on a 2-core Xeon the two were level. Products of fewer than
:data:`MIN_ROWS` rows are padded to a multiple of :data:`SMALL_ROWS` rows for oneDNN.

So the first float32 product of a process that could take either (the CPU, float32, no
autograd graph to build, not tracing or compiling) decides, once, from the CPU: oneDNN on an
AMD processor with AVX-512 (``vendor_id`` AuthenticAMD, flag ``avx512f``), MKL elsewhere (on an
AVX2-only EPYC oneDNN measured 0.91-1.01x MKL; on Intel the two were level), and oneDNN only
after its result was checked against ``F.linear`` on a small product (float32 rounding). The
two libraries round differently, so the choice must not depend on the moment: an earlier
version timed both at the first product, and beside two busy processes that timing picked
oneDNN on the AVX2 EPYC in one process of six ("1.21x"), so two processes of one job computed
the same text differently. ``BERTATTN_CPU_GEMM`` (read at that first product): ``auto`` (the
rule above), ``mkl``, ``onednn``, or ``timed``, which times both on a product of MiniLM's widths
(256 rows, 384 -> 1,536) at the caller's thread count and takes oneDNN from :data:`MARGIN`
times as fast (for a CPU the rule has not seen; run it on a quiet machine).
:func:`describe` says what was chosen and why, and ``bertattn.explain()`` repeats it for a
float32 model on the CPU. Importing this module caps oneDNN's kernel caches
(:data:`CACHE_CAPACITY`) unless their variables are set.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cpu import cpu_flags, cpu_vendor

__all__ = [
    "CHOICES",
    "ENV",
    "MARGIN",
    "choice",
    "describe",
    "eligible",
    "linear",
    "reset",
    "uses_onednn",
]

log = logging.getLogger(__name__)

#: the environment variable that sets the choice instead of the CPU's rule
ENV = "BERTATTN_CPU_GEMM"
#: what it may say
CHOICES = ("auto", "mkl", "onednn", "timed")
#: ``timed``: oneDNN is chosen when at least this many times as fast as MKL
MARGIN = 1.15
#: oneDNN generates a kernel for each new shape (0.3-0.8 ms on the EPYC above, against ~50 us
#: for MKL to meet a new row count). From this many rows a product keeps its own row count
#: (a packed batch's real tokens, new at almost every batch): its own time hides the kernel's
#: (one layer's product alone takes ~0.8 ms there with MKL, and the kernel serves every layer
#: of the forward).
MIN_ROWS = 128
#: below :data:`MIN_ROWS`, the rows are padded with zeros to a multiple of this, so a short
#: query's products meet one of three kernels made once (32, 64, 96 rows) rather than a new
#: one for each token count; a product of few rows reads its weight once whatever its row
#: count, so the padding costs little. Measured, one short query (MiniLM, 2-core EPYC):
#: median 6.1-6.5 ms with MKL, 4.5-5.0 ms through oneDNN.
SMALL_ROWS = 32

#: oneDNN kernels kept per process: oneDNN's primitive cache and PyTorch's own cache over it
#: (ideep's) each keep 1,024 by default, one per product shape; a server's or a packed batch's
#: row count changes every batch, so they grew to 6.8 GB (MiniLM's four product widths, 1,000
#: row counts) and a small model's server grew 200 MB in two minutes. 32 holds every shape of
#: a forward (five widths with the fused GELU, one row count per chunk worker) three times
#: over. Measured (MiniLM float32, 300 forwards of 4 texts at 40-240 tokens, 2-core EPYC):
#: 1,024 -> 1,291 MB resident, 64 -> 672, 32 -> 569, 16 -> 516 (MKL alone: 606), 48-52 ms a
#: forward at each. Set here, before oneDNN's first kernel (both read their variable then),
#: unless set already.
CACHE_CAPACITY = 32
for _var in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_var, str(CACHE_CAPACITY))

_lock = threading.Lock()
_chosen: str | None = None  # "mkl" or "onednn", once decided
_why = "not decided yet (no float32 CPU product has run)"


def _onednn_op():  # type: ignore[no-untyped-def]
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _onednn(
    x: Tensor, weight: Tensor, bias: Tensor | None, attr: str = "none", algorithm: str = ""
) -> Tensor:
    """oneDNN's ``linear`` with the element-wise ``attr`` after it ("none" or "gelu", whose
    ``algorithm`` "none" is the exact GELU); rows below :data:`MIN_ROWS` padded to a multiple
    of :data:`SMALL_ROWS`. ``x``: ``(..., K)``; returns ``(..., N)``."""
    op = _onednn_op()
    k = x.shape[-1]
    rows = x.numel() // k
    if rows >= MIN_ROWS or rows % SMALL_ROWS == 0:
        return op(x, weight, bias, attr, [], algorithm)  # type: ignore[misc]
    padded = x.new_empty(-(-rows // SMALL_ROWS) * SMALL_ROWS, k)
    padded[:rows].copy_(x.reshape(rows, k))
    padded[rows:].zero_()
    out = op(padded, weight, bias, attr, [], algorithm)  # type: ignore[misc]
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def _compiling() -> bool:
    """Tracing or compiling: the op is left to the compiler, and this module's choice is not
    read (a read would be guarded on, and the first choice would recompile)."""
    return bool(torch.compiler.is_compiling() or torch._C._get_tracing_state())


def _fits(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """float32 CPU tensors of contiguous input (at least one row), no graph to build."""
    if not (
        x.dtype is torch.float32
        and weight.dtype is torch.float32
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and x.dim() >= 2
        and x.shape[-1] > 0
        and x.numel() > 0
        and x.is_contiguous()
        and weight.is_contiguous()
        and (bias is None or (bias.dtype is torch.float32 and bias.is_contiguous()))
    ):
        return False
    return not (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    )  # the op has no backward


def eligible(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """The call may go to oneDNN: float32 CPU tensors of contiguous input (at least one row),
    no graph to build, not tracing or compiling."""
    return not _compiling() and _fits(x, weight, bias)


def uses_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """This product goes to oneDNN: it is :func:`eligible` and oneDNN was chosen for the
    process (chosen now if no product has run yet)."""
    if _compiling() or _chosen == "mkl" or not _fits(x, weight, bias):
        return False
    if _chosen is None:
        _decide()
    return _chosen == "onednn"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN where :func:`uses_onednn` says so (float32
    CPU tensors, no autograd graph, not tracing or compiling, oneDNN chosen for this process).
    ``x``: ``(..., K)``; ``weight``: ``(N, K)``; returns ``(..., N)``."""
    if uses_onednn(x, weight, bias):
        return _onednn(x, weight, bias)
    return F.linear(x, weight, bias)


def choice() -> str:
    """``"mkl"`` or ``"onednn"``: the library for this process's float32 CPU products (decided
    now if no product has run yet)."""
    if _chosen is None:
        _decide()
    return _chosen  # type: ignore[return-value]


def describe() -> str:
    """One line: the library chosen for float32 CPU products and why."""
    return f"float32 CPU products: {_chosen or 'undecided'} ({_why})"


def reset() -> None:
    """Forget the choice: the next eligible product decides again (tests; after changing
    :data:`ENV`)."""
    global _chosen, _why
    with _lock:
        _chosen, _why = None, "not decided yet (no float32 CPU product has run)"


def _decide() -> None:
    global _chosen, _why
    with _lock:
        if _chosen is not None:
            return
        _chosen, _why = _measure()
        log.info("%s", describe())


def _measure() -> tuple[str, str]:
    """``(choice, why)``; see the module docstring."""
    asked = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if asked not in CHOICES:
        raise ValueError(
            f"{ENV}={os.environ.get(ENV)!r} is not one of {', '.join(CHOICES)}; unset it to let "
            f"bertattn choose from the CPU, or set mkl, onednn or timed."
        )
    if asked == "auto":
        choice, why = _by_cpu()
    else:
        choice, why = asked, f"{ENV}={asked}"
    if choice == "mkl":
        return choice, why  # oneDNN is not a candidate: nothing to check
    if _onednn_op() is None or not torch.backends.mkldnn.is_available():
        return "mkl", "this torch build has no oneDNN linear"
    bad = _disagreement()
    if bad:
        return "mkl", bad
    return _timed() if choice == "timed" else (choice, why)


def _timed() -> tuple[str, str]:
    """``BERTATTN_CPU_GEMM=timed``: both libraries timed on one of MiniLM's products at the
    caller's thread count; oneDNN from :data:`MARGIN` times as fast."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 384, generator=g)
    w = torch.randn(1536, 384, generator=g) * 0.05
    b = torch.randn(1536, generator=g)
    with torch.inference_mode():
        mkl = _best(lambda: F.linear(x, w, b))
        dnn = _best(lambda: _onednn(x, w, b))
    ratio = mkl / max(dnn, 1e-12)
    threads = torch.get_num_threads()
    how = f"oneDNN {ratio:.2f}x MKL at 256x384x1536, {threads} thread{'s' * (threads > 1)}"
    if ratio >= MARGIN:
        return "onednn", f"{ENV}=timed: measured {how}"
    return "mkl", f"{ENV}=timed: measured {how}; oneDNN is used from {MARGIN}x"


def _by_cpu() -> tuple[str, str]:
    """``(choice, why)`` from the CPU alone (see the module docstring): the same in every
    process on the machine, whatever its load."""
    vendor, flags = cpu_vendor(), cpu_flags()
    if vendor == "AuthenticAMD" and "avx512f" in flags:
        return "onednn", (
            "an AMD CPU with AVX-512, which MKL leaves unused on AMD (oneDNN measured 2.0-2.5x "
            "MKL on such an EPYC)"
        )
    what = f"{vendor or 'an unknown vendor'} {'with' if 'avx512f' in flags else 'without'} AVX-512"
    return "mkl", (
        f"{what}: MKL, as torch does; oneDNN measured level or slower on the Intel CPUs and the "
        f"AMD CPU without AVX-512 tried"
    )


def _disagreement() -> str:
    """Why oneDNN cannot stand in for ``F.linear`` here ('' when it can): an error, or a
    result beyond float32 rounding of the same product."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 17, 40, generator=g)
    w = torch.randn(56, 40, generator=g) * 0.2
    b = torch.randn(56, generator=g)
    try:
        with torch.inference_mode():
            got = _onednn(x, w, b)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        return f"oneDNN linear failed here ({exc})"
    want = F.linear(x.double(), w.double(), b.double())
    if got.shape != want.shape or not torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5):
        return "oneDNN linear disagreed with F.linear here"
    return ""


def _best(fn) -> float:  # type: ignore[no-untyped-def]
    """The fastest of a few timed calls, after two untimed ones."""
    fn()
    fn()
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
