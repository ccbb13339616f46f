"""Which library computes a float32 product on the CPU: MKL (``F.linear``) or oneDNN.

PyTorch's CPU builds send a float32 ``F.linear`` to MKL's ``sgemm``. MKL picks its kernels by
the CPU's vendor, and on AMD processors it leaves AVX-512 unused; oneDNN (also in every x86
build, as ``torch.ops.mkldnn._linear_pointwise``, the op ``torch.compile`` emits for CPU linear
layers) generates its kernels from the CPU's instruction set whoever made it. Measured on a
2-core AMD EPYC with AVX-512 (torch 2.13.0, 2 threads, MiniLM widths): oneDNN 2.0-2.3x MKL's
rate from 10 to 4,096 rows (2048^3: 393 against 188 GFLOP/s), and ``Bert.encode`` 1.7x on
paragraphs, 1.6x on short texts; on a 2-core Xeon the two were level. Products of fewer than
:data:`MIN_ROWS` rows are padded to a multiple of :data:`SMALL_ROWS` rows for oneDNN.

The choice is made per shape class (:data:`CLASSES`), since the library that wins on a batch
need not win on one short query: ``tiny`` products (fewer than :data:`TINY_MACS`
multiply-adds, e.g. a ``MultiHeadAttention`` of width 64 on 16 tokens), where oneDNN's per-call
cost is larger than the product; ``small`` ones (fewer than :data:`MIN_ROWS` rows, a short
query at a model's widths); and ``large`` ones (a batch). The first float32 product of a
process that could take either (the CPU, float32, no autograd graph to build, not tracing or
compiling) decides every class at once:

* ``BERTATTN_CPU_GEMM`` unset or ``auto``: **timed on this machine** (:func:`_time_classes`:
  one product of each class's shape, MKL and oneDNN interleaved, medians; about 0.1 s) and
  kept in bertattn's cache folder (:func:`cache_path`, ``gemm-probes.json`` beside the dtype
  probe's file, :mod:`bertattn.runtime.probe`: per CPU model, torch version and thread count,
  file-locked and atomic), so every later process on the machine, and every
  process of a job started together, reads the same choice and computes the same bits. oneDNN
  is taken for a class only from :data:`MARGIN` times as fast as MKL (closer is noise: MKL, as
  torch does, is kept), and only after its result was checked against ``F.linear`` on a small
  product (float32 rounding);
* where the probes are off (``BERTATTN_DTYPE_PROBE=0``) or the timing fails: the CPU's rule,
  :func:`_by_cpu` (oneDNN for small and large products on an AMD processor with AVX-512, which
  MKL leaves unused on AMD, but MKL on Zen 4, whose AVX-512 runs on 256-bit units; MKL for
  tiny products everywhere and for every product elsewhere; on an AVX2-only EPYC oneDNN
  measured 0.91-1.01x MKL; on Intel the two were level);
* ``rule``: that rule without timing; ``mkl`` or ``onednn``: that library for every class;
  ``timed``: one product of MiniLM's widths (256 rows, 384 -> 1,536) timed now in this process
  at the caller's thread count, not cached, oneDNN for every class from :data:`MARGIN` times as
  fast (an experiment; its answer may differ between processes).

The two libraries round differently, so the choice must not depend on the moment: an earlier
version timed both at each process's first product, and beside two busy processes that timing
picked oneDNN on the AVX2 EPYC in one process of six ("1.21x"), so two processes of one job
computed the same text differently. The cached timing has one answer per machine, thread count
and torch. :func:`describe` says what was chosen and why, and ``bertattn.explain()`` repeats it
for a float32 model on the CPU. Importing this module caps oneDNN's kernel caches
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

from ..runtime.cpu import cpu_family, cpu_flags, cpu_vendor, is_zen4

__all__ = [
    "CHOICES",
    "CLASSES",
    "ENV",
    "MARGIN",
    "TINY_MACS",
    "choice",
    "choices",
    "describe",
    "eligible",
    "linear",
    "reset",
    "shape_class",
    "uses_onednn",
]

log = logging.getLogger(__name__)

#: the environment variable that sets the choice instead of the CPU's rule
ENV = "BERTATTN_CPU_GEMM"
#: what it may say
CHOICES = ("auto", "rule", "mkl", "onednn", "timed")
#: the shape classes, each with its own library (see the module docstring)
CLASSES = ("tiny", "small", "large")
#: oneDNN is chosen for a timed class when at least this many times as fast as MKL
MARGIN = 1.15
#: a product of fewer multiply-adds (rows x K x N) than this is ``tiny``: its time is mostly
#: the call's own cost (a width-64 attention module on 16 tokens: 16 x 64 x 192, ~0.2 M)
TINY_MACS = 1 << 20
#: the shape timed for each class, ``(rows, K, N)``: a width-64 module's fused q/k/v on 16
#: tokens; a 9-token query's feed-forward product at MiniLM's widths; a batch's (256 rows)
CLASS_SHAPES: dict[str, tuple[int, int, int]] = {
    "tiny": (16, 64, 192),
    "small": (9, 384, 1536),
    "large": (256, 384, 1536),
}
#: the file in bertattn's cache folder the class timings are kept in (:func:`cache_path`)
CACHE_FILE = "gemm-probes.json"
#: rounds of the class timing (each a loop of calls of about :data:`_LOOP_S` seconds)
_ROUNDS = 7
_LOOP_S = 0.002
#: a timing whose threads waited for a CPU longer than this share of their time is not kept:
#: another process held the cores, and the libraries' speeds under that load say nothing of
#: the machine (on a 2-core EPYC beside other processes MKL's two-thread products ran 2-4x
#: slower than oneDNN's, at 0.9-1.1x when quiet)
MAX_WAIT_SHARE = 0.05


class Disturbed(RuntimeError):
    """The class timing waited for a CPU too long to be kept (:data:`MAX_WAIT_SHARE`)."""


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
_UNDECIDED = "not decided yet (no float32 CPU product has run)"
#: the ``large`` class's library ("mkl" or "onednn") once decided: what :func:`choice` says
_chosen: str | None = None
#: every class's library once decided
_by_class: dict[str, str] = {}
#: True once decided with MKL for every class: the hot path then calls ``F.linear`` at once
_all_mkl = False
_why = _UNDECIDED


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


def shape_class(rows: int, k: int, n: int) -> str:
    """The :data:`CLASSES` name of a product of ``rows`` x ``k`` by ``k`` x ``n``."""
    if rows * k * n < TINY_MACS:
        return "tiny"
    return "small" if rows < MIN_ROWS else "large"


def uses_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """This product goes to oneDNN: it is :func:`eligible` and oneDNN was chosen for its
    shape class (:func:`shape_class`) in this process (chosen now if no product has run
    yet)."""
    if _all_mkl or _compiling() or not _fits(x, weight, bias):
        return False
    if _chosen is None:
        _decide()
        if _all_mkl:
            return False
    k = x.shape[-1]
    return _by_class[shape_class(x.numel() // k, k, weight.shape[0])] == "onednn"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN where :func:`uses_onednn` says so (float32
    CPU tensors, no autograd graph, not tracing or compiling, oneDNN chosen for this product's
    shape class). ``x``: ``(..., K)``; ``weight``: ``(N, K)``; returns ``(..., N)``."""
    if _all_mkl:  # decided, MKL everywhere: F.linear is the answer whatever the call
        return F.linear(x, weight, bias)
    if uses_onednn(x, weight, bias):
        return _onednn(x, weight, bias)
    return F.linear(x, weight, bias)


def choice() -> str:
    """``"mkl"`` or ``"onednn"``: the library for this process's float32 CPU products of the
    ``large`` class, a batch's (decided now if no product has run yet; :func:`choices` has
    every class)."""
    if _chosen is None:
        _decide()
    return _chosen  # type: ignore[return-value]


def choices() -> dict[str, str]:
    """Every class's library, ``{"tiny": ..., "small": ..., "large": ...}`` (decided now if
    no product has run yet)."""
    if _chosen is None:
        _decide()
    return dict(_by_class)


def describe() -> str:
    """One line: the library chosen for float32 CPU products (per class where they differ) and
    why."""
    if _chosen is None:
        return f"float32 CPU products: undecided ({_why})"
    libs = set(_by_class.values())
    if len(libs) == 1:
        return f"float32 CPU products: {_chosen} ({_why})"
    per = ", ".join(f"{c} {_by_class[c]}" for c in CLASSES)
    return f"float32 CPU products: {_chosen} for batches; {per} ({_why})"


def reset() -> None:
    """Forget the choice: the next eligible product decides again (tests; after changing
    :data:`ENV`)."""
    global _chosen, _why, _all_mkl
    with _lock:
        _chosen, _why, _all_mkl = None, _UNDECIDED, False
        _by_class.clear()


def _decide() -> None:
    global _chosen, _why, _all_mkl
    with _lock:
        if _chosen is not None:
            return
        by_class, why = _measure()
        _by_class.clear()
        _by_class.update(by_class)
        _why = why
        _all_mkl = all(lib == "mkl" for lib in by_class.values())
        _chosen = by_class["large"]
        log.info("%s", describe())


def _every(lib: str) -> dict[str, str]:
    return dict.fromkeys(CLASSES, lib)


def _measure() -> tuple[dict[str, str], str]:
    """``(library per class, why)``; see the module docstring."""
    asked = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if asked not in CHOICES:
        raise ValueError(
            f"{ENV}={os.environ.get(ENV)!r} is not one of {', '.join(CHOICES)}; unset it to let "
            f"bertattn choose (timed once per machine), or set rule, mkl, onednn or timed."
        )
    if asked in ("auto", "rule"):
        wanted, why = _by_cpu()
    else:
        wanted, why = _every(asked), f"{ENV}={asked}"
    if asked == "auto":
        from ..runtime import probe as _probe  # imported when needed

        if not _probe.probing_enabled():
            asked, why = "rule", f"{why} (not timed: {_probe.PROBE_ENV}=0)"
    if asked != "auto" and all(lib == "mkl" for lib in wanted.values()):
        return wanted, why  # oneDNN is not a candidate: nothing to check
    if _onednn_op() is None or not torch.backends.mkldnn.is_available():
        return _every("mkl"), "this torch build has no oneDNN linear"
    bad = _disagreement()
    if bad:
        return _every("mkl"), bad
    if asked == "timed":
        return _timed()
    if asked == "auto":
        try:
            return _cached_timing()
        except Disturbed as exc:  # nothing cached: a quiet process times it later
            log.info("%s; the CPU's rule decides in this process", exc)
            return wanted, f"{why} (not timed: {exc})"
        except Exception as exc:  # a failed allocation, an op that raises here, ...
            log.warning(
                "timing the float32 product libraries failed (%s: %s); the CPU's rule decides",
                type(exc).__name__,
                exc,
            )
            return wanted, f"{why} (not timed: {type(exc).__name__}: {exc})"
    return wanted, why


def _cached_timing() -> tuple[dict[str, str], str]:
    """Every class's library from the probe cache, timed now (:func:`_time_classes`) and kept
    there when this machine, torch and thread count have no entry yet."""
    from ..runtime import probe as _probe

    threads = torch.get_num_threads()
    shapes = " ".join(f"{c}={'x'.join(map(str, CLASS_SHAPES[c]))}" for c in CLASSES)
    key = _probe.machine_key("cpu-gemm", threads, shapes=shapes.replace(" ", ","))
    entry, fresh = _cached(key)
    try:
        ratios = {c: float(entry["ratios"][c]) for c in CLASSES}
        date = str(entry["date"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"the probe cache {cache_path()} holds a bad entry for {key!r}; delete the file "
            f"to measure again."
        ) from None
    by_class = {c: "onednn" if ratios[c] >= MARGIN else "mkl" for c in CLASSES}
    per = ", ".join(f"{c} {ratios[c]:.2f}x" for c in CLASSES)
    how = "timed now" if fresh else "timed"
    why = (
        f"{how} {date} on this CPU at {threads} thread{'s' * (threads != 1)}, oneDNN's speed "
        f"over MKL's: {per}; oneDNN from {MARGIN}x"
    )
    return by_class, why


def cache_path():  # type: ignore[no-untyped-def]
    """Where the class timings are kept: :data:`CACHE_FILE` beside the dtype probe's file in
    bertattn's cache folder (:func:`bertattn.runtime.probe.cache_path`)."""
    from ..runtime import probe as _probe

    return _probe.cache_path().with_name(CACHE_FILE)


def _cached(key: str) -> tuple[dict, bool]:
    """The entry ``key`` of :func:`cache_path`, timed now (:func:`_time_classes`) and written
    there when missing; whether it was timed now. The file has the probe cache's format and
    safety (read, then under its file lock read again, time only if still missing, written
    atomically), but a file and lock of its own: the dtype probe times its float32 products
    through :func:`linear`, so this choice can be made inside the dtype probe's measurement,
    which holds that cache's locks."""
    from ..runtime import probe as _probe

    return _probe.cached_in(cache_path(), key, _time_classes)


def _time_classes() -> dict:
    """One product of each class's shape (:data:`CLASS_SHAPES`), MKL and oneDNN in turn, each
    a loop of calls, :data:`_ROUNDS` rounds after a warm-up; oneDNN's speed over MKL's per
    class (the fastest round of each), as the cache keeps it. About 0.1-0.5 s. Raises
    :class:`Disturbed` when the computing threads waited for a CPU more than
    :data:`MAX_WAIT_SHARE` of the time (the kernel's run-queue delay, where it can be read)."""
    import datetime

    from ..runtime.threads import RunDelay

    delay = RunDelay()
    waited0, wall0 = delay.total(), time.perf_counter()
    g = torch.Generator().manual_seed(0)
    ratios: dict[str, float] = {}
    with torch.inference_mode():
        for cls in CLASSES:
            rows, k, n = CLASS_SHAPES[cls]
            x = torch.randn(rows, k, generator=g)
            w = torch.randn(n, k, generator=g) * k**-0.5
            b = torch.randn(n, generator=g)
            fns = (
                lambda x=x, w=w, b=b: F.linear(x, w, b),
                lambda x=x, w=w, b=b: _onednn(x, w, b),
            )
            for fn in fns:  # warm-up: oneDNN makes its kernel on first use
                fn()
                fn()
            start = time.perf_counter()
            fns[0]()
            loop = max(1, min(1000, int(_LOOP_S / max(time.perf_counter() - start, 1e-7))))
            times: tuple[list[float], list[float]] = ([], [])
            for r in range(_ROUNDS):
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    start = time.perf_counter()
                    for _ in range(loop):
                        fns[i]()
                    times[i].append(time.perf_counter() - start)
            mkl, dnn = min(times[0]), min(times[1])  # the least disturbed round of each
            ratios[cls] = round(mkl / max(dnn, 1e-12), 4)
    waited1, wall = delay.total(), time.perf_counter() - wall0
    if waited0 is not None and waited1 is not None:
        share = (waited1 - waited0) * 1e-9 / max(wall * torch.get_num_threads(), 1e-9)
        if share > MAX_WAIT_SHARE:
            raise Disturbed(
                f"the timing of the product libraries waited {share:.0%} of its time for a CPU "
                f"(another process held the cores; kept from {MAX_WAIT_SHARE:.0%} at most)"
            )
    return {"ratios": ratios, "date": datetime.date.today().isoformat()}


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
        return _every("onednn"), f"{ENV}=timed: measured {how}"
    return _every("mkl"), f"{ENV}=timed: measured {how}; oneDNN is used from {MARGIN}x"


def _by_cpu() -> tuple[dict[str, str], str]:
    """``(library per class, why)`` from the CPU alone (see the module docstring): the same in
    every process on the machine, whatever its load."""
    vendor, flags = cpu_vendor(), cpu_flags()
    if is_zen4(vendor, cpu_family(), flags):  # oneDNN's padding costs more than it gains there
        return _every("mkl"), (
            "an AMD Zen 4 CPU (family 25 with AVX-512), whose AVX-512 runs on 256-bit units: "
            "MKL, as torch does (oneDNN measured 0.20x / 0.67x / 1.03-1.13x MKL on tiny, small "
            "and batch products of a 2-core Zen 4 EPYC)"
        )
    if vendor == "AuthenticAMD" and "avx512f" in flags:
        return {"tiny": "mkl", "small": "onednn", "large": "onednn"}, (
            "an AMD CPU with AVX-512, which MKL leaves unused on AMD (oneDNN measured 2.0-2.5x "
            "MKL on such an EPYC; tiny products stay on MKL, where oneDNN's call costs more "
            "than the product)"
        )
    what = f"{vendor or 'an unknown vendor'} {'with' if 'avx512f' in flags else 'without'} AVX-512"
    return _every("mkl"), (
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
