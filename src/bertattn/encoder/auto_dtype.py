"""``dtype="auto"`` for :meth:`bertattn.Bert.load` and the command line: the compute dtype that
is fastest on the machine the model runs on, and why.

On the CPU it is measured (:func:`probe_dtype`): the model's own matrix products (hidden x
hidden, hidden x intermediate and back, at :data:`PROBE_ROWS` rows) timed in float32 and in
bfloat16, interleaved, a few hundred milliseconds the first time. bfloat16 is chosen when it is
at least :data:`MARGIN` times as fast; closer than that is noise, and float32 (exact) is kept.
The result is kept per CPU model, torch version, thread count and widths in the user's cache
folder (:mod:`bertattn.runtime.probe`), so every later process there gets the same dtype without
timing again; its reason carries the numbers (``"bf16 1.62x fp32 (timed 2026-12-04, 2 threads;
...)"``). ``BERTATTN_DTYPE_PROBE=0`` turns the timing off.

A timing taken while other processes held the cores is not kept: when the timing threads
waited for a CPU more than :data:`bertattn.attention.gemm.MAX_WAIT_SHARE` of the time (the
kernel's run-queue delay, as the product-library timing reads it), the process says so (an INFO
log line, and the reason of the choice), follows the CPU's flags, and writes nothing: a later,
quiet process times it. ``bertattn bench --dispatch --remeasure`` forgets the kept timings and
takes them again.

Where the probe is off or cannot run, the CPU's flags decide (measured on the CPUs of
docs/performance.md):

* a CPU with AMX (the /proc/cpuinfo flag ``amx_bf16``): bfloat16. Its tile units multiply bf16
  matrices natively, and bf16 encodes faster than fp32 there;
* an AMD Zen 4 (``cpu family`` 25 with AVX512_BF16): bfloat16. Measured on two 2-core Zen 4
  EPYCs: encode 1.69x fp32 on short texts on one, 1.59-1.75x on short texts and 1.68-1.73x on
  paragraphs on the other (its products 1.77x);
* any other CPU with AVX512_BF16 but no AMX: float32. bf16 is native there too, and was
  measured slower than fp32 on one such CPU, an Intel Xeon (bertattn 248 vs 357 texts/s,
  OpenVINO 197 vs 288): which is why the probe decides where it can;
* any other CPU: float32. With no native bf16 matrix product oneDNN emulates it, slower still;
* CUDA: bfloat16 where ``torch.cuda.is_bf16_supported()`` (Ampere and later), else float16 (not
  timed);
* any other device: float32 (nothing measured).

``auto`` never chooses int8 (opt-in: ``dtype="int8"``, :mod:`bertattn.encoder.int8`).

This is ``"auto"``'s ``"fastest"`` meaning (:data:`bertattn.dtypes.AUTO_MEANINGS`), not what
``BertModel.from_pretrained(..., dtype="auto")`` means: there, as in transformers, ``"auto"``
is the dtype the checkpoint was saved in (its config.json, the ``"checkpoint"`` meaning), and
it stays so, since code written for transformers relies on it. ``Bert`` is bertattn's own
entry point, and there ``"auto"`` asks for the fastest dtype here.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..runtime import cpu as _cpu
from ..runtime import probe as _probe
from ..runtime.cpu import cpu_capability, is_zen4

__all__ = ["DtypeChoice", "choose_dtype", "flag_rule", "probe_dtype", "reset"]

log = logging.getLogger(__name__)

#: the reasons, one per branch of the CPU rule (tests and docs quote them)
AMX_WHY = "AMX: bf16 matmuls run on the tile units, measured faster than fp32"
AVX512_BF16_WHY = "AVX512_BF16 without AMX: bf16 measured slower than fp32"
ZEN4_WHY = "AMD Zen 4 with AVX512_BF16: bf16 measured 1.6-1.8x faster than fp32"
EMULATED_WHY = "no native bf16 matmul: bf16 emulated (slower than fp32)"

#: bfloat16 is chosen when its products take at most 1/MARGIN of float32's time; closer is
#: within the noise of a short timing on a shared machine, and float32 is kept
MARGIN = 1.1
#: the rows of the timed products (a batch of a few short texts, or one paragraph)
PROBE_ROWS = 256
#: the widths timed when the model's are not given: all-MiniLM-L6-v2's (hidden, intermediate)
DEFAULT_WIDTHS = (384, 1536)
#: the timing stops after this many seconds of rounds (at least :data:`MIN_ROUNDS`)
PROBE_BUDGET_S = 0.3
MIN_ROUNDS = 3
MAX_ROUNDS = 7

#: a timer: one round's seconds for the products in the given dtype
Timer = Callable[[torch.dtype], float]

#: what this process measured or read, by cache key: one answer per key for the process's life
_seen: dict[str, dict] = {}
#: keys whose timing was disturbed in this process -> why: the flag rule answers for them here
_disturbed: dict[str, str] = {}
#: the run-queue delay reader of the busy check (a class whose ``total()`` gives ns, or None);
#: None: :class:`bertattn.runtime.threads.RunDelay`, and no check of a ``timer=`` given (tests
#: set it)
RunDelay: Callable[[], Any] | None = None


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype :func:`choose_dtype` picked (``dtype``) and why (``reason``, one line; with the
    timings when the probe decided)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        """The dtype's name without ``torch.`` (``"bfloat16"``), as the command line spells it."""
        return str(self.dtype).replace("torch.", "")

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def choose_dtype(
    device: str | torch.device = "cpu",
    *,
    cpu_flags: set[str] | None = None,
    cuda_bf16: bool | None = None,
    probe: bool | None = None,
    threads: int | None = None,
    widths: tuple[int, int] | None = None,
    timer: Timer | None = None,
) -> DtypeChoice:
    """The compute dtype ``dtype="auto"`` gives on ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:N"``, ``"auto"`` or a torch.device), with its reason; see the module docstring.
    Nothing is loaded.

    Args:
        cpu_flags: the CPU's /proc/cpuinfo flags for the flag rule (default: this machine's).
            Given, the flag rule answers for those flags (a probe would time this machine).
        cuda_bf16: whether the GPU does bf16 (default: ``torch.cuda.is_bf16_supported()``).
        probe: time the products on the CPU (:func:`probe_dtype`); None: unless
            ``BERTATTN_DTYPE_PROBE`` says off or ``cpu_flags`` is given.
        threads: the thread count the model will compute with, timed at (default: torch's).
        widths: the model's ``(hidden_size, intermediate_size)`` (default: MiniLM's).
        timer: one round's seconds for a dtype, instead of timing the products (tests).
    """
    kind = _device_type(device)
    if kind == "cuda":
        if cuda_bf16 is None:
            cuda_bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if cuda_bf16:
            return DtypeChoice(torch.bfloat16, "CUDA with bf16 support: bfloat16")
        return DtypeChoice(torch.float16, "CUDA without bf16 support: float16")
    if kind != "cpu":
        return DtypeChoice(torch.float32, f"no measured rule for {kind}: float32")
    why_not = ""
    if probe is None:
        probe = cpu_flags is None and _probe.probing_enabled()
        if not probe and cpu_flags is None:
            why_not = f" (not timed: {_probe.PROBE_ENV}=0)"
    if probe:
        try:
            return probe_dtype(threads=threads, widths=widths, timer=timer)
        except _disturbed_error() as exc:  # nothing kept: a quiet process times it later
            why_not = f" (not timed: {exc})"
        except Exception as exc:  # no bf16 kernel in this build, a failed allocation, ...
            log.warning(
                "the dtype probe failed (%s: %s); the CPU's flags decide", type(exc).__name__, exc
            )
            why_not = f" (not timed: the probe failed: {type(exc).__name__}: {exc})"
    rule = flag_rule(cpu_flags)
    return DtypeChoice(rule.dtype, rule.reason + why_not) if why_not else rule


def flag_rule(
    cpu_flags: set[str] | None = None, *, vendor: str | None = None, family: int | None = None
) -> DtypeChoice:
    """The CPU's flag rule (the fallback of :func:`choose_dtype`; see the module docstring).
    ``vendor`` / ``family``: /proc/cpuinfo's ``vendor_id`` and ``cpu family``; read from this
    machine when ``cpu_flags`` is not given either, else unknown unless given."""
    if cpu_flags is None:
        vendor = _cpu.cpu_vendor() if vendor is None else vendor
        family = _cpu.cpu_family() if family is None else family
    cap = cpu_capability(cpu_flags)
    if cap["capability"] == "AMX":
        return DtypeChoice(torch.bfloat16, AMX_WHY)
    if cap["bf16_matmul"] == "native" and is_zen4(vendor, family, set(cap["flags"])):
        return DtypeChoice(torch.bfloat16, ZEN4_WHY)
    if cap["bf16_matmul"] == "native":
        return DtypeChoice(torch.float32, AVX512_BF16_WHY)
    return DtypeChoice(torch.float32, EMULATED_WHY)


def probe_dtype(
    *,
    threads: int | None = None,
    widths: tuple[int, int] | None = None,
    timer: Timer | None = None,
    rows: int = PROBE_ROWS,
) -> DtypeChoice:
    """float32 or bfloat16 on this CPU, by timing: the cached answer for this CPU model, torch
    version, thread count (``threads``, default torch's) and ``widths`` (``(hidden,
    intermediate)``, default MiniLM's) when there is one (this process's, else the cache
    file's), else a new timing of :func:`time_products` (or ``timer``), written to the cache.
    bfloat16 when at least :data:`MARGIN` times as fast. Raises what the timing raises."""
    threads = torch.get_num_threads() if threads is None else int(threads)
    hidden, inter = DEFAULT_WIDTHS if widths is None else (int(widths[0]), int(widths[1]))
    if min(hidden, inter, rows, threads) < 1:
        raise ValueError(
            f"the dtype probe needs positive widths, rows and threads; got widths "
            f"{(hidden, inter)}, rows {rows}, threads {threads}."
        )
    key = _probe.machine_key("dtype", threads, hidden=hidden, intermediate=inter, rows=rows)
    if key in _disturbed:  # this process's timing was disturbed: not timed again here
        raise _disturbed_error()(_disturbed[key])
    entry = _seen.get(key)
    if entry is None:

        def measure() -> dict:
            with _threads(threads):
                if timer is not None and RunDelay is None:  # a test's own times: no CPU waits
                    return _measure(timer)
                return _measure_quietly(timer or _product_timer(hidden, inter, rows), threads)

        try:
            entry, fresh = _probe.cached(key, measure)
        except _disturbed_error() as exc:
            _disturbed[key] = str(exc)
            log.info("%s; the CPU's flags decide in this process", exc)
            raise
        if fresh:
            log.info("dtype probe: %s", _reason(entry, threads, hidden, inter, rows))
        _seen[key] = entry
    try:
        dtype = torch.bfloat16 if entry["dtype"] == "bfloat16" else torch.float32
        return DtypeChoice(dtype, _reason(entry, threads, hidden, inter, rows))
    except (KeyError, TypeError, ValueError):  # an entry this version did not write
        _seen.pop(key, None)
        raise ValueError(
            f"the probe cache {_probe.cache_path()} holds a bad entry for {key!r}; "
            f"delete the file to measure again."
        ) from None


def reset() -> None:
    """Forget this process's answers (the cache file stays): the next call reads it again."""
    _seen.clear()
    _disturbed.clear()


def _disturbed_error() -> type[Exception]:
    """The error of a timing taken on a busy CPU: the product-library timing's, shared."""
    from ..attention.gemm import Disturbed  # attention/ imports nothing of bert/ at import

    return Disturbed


def _measure_quietly(run: Timer, threads: int) -> dict:
    """:func:`_measure`, refused (``gemm.Disturbed``, so nothing is cached) when its threads
    waited for a CPU more than ``gemm.MAX_WAIT_SHARE`` of the time, ``threads`` threads over
    the wall time (another process held the cores). Where the delay cannot be read (not Linux),
    the timing is kept."""
    from ..attention.gemm import MAX_WAIT_SHARE
    from ..runtime import threads as machine_threads

    delay = (RunDelay or machine_threads.RunDelay)()
    waited0, start = delay.total(), time.perf_counter()
    entry = _measure(run)
    waited1, wall = delay.total(), time.perf_counter() - start
    if waited0 is None or waited1 is None:
        return entry
    share = (waited1 - waited0) * 1e-9 / max(wall * threads, 1e-9)
    if share > MAX_WAIT_SHARE:
        raise _disturbed_error()(
            f"the dtype probe waited {share:.0%} of its time for a CPU (another process held "
            f"the cores; kept from {MAX_WAIT_SHARE:.0%} at most), so it was not cached; "
            f"bertattn bench --dispatch --remeasure times it again"
        )
    return entry


def _measure(run: Timer) -> dict:
    """Rounds of ``run`` in float32 and bfloat16, in turn (the order alternating), until
    :data:`PROBE_BUDGET_S` is spent (from :data:`MIN_ROUNDS` to :data:`MAX_ROUNDS`); the
    medians, their ratio and the choice, as the cache keeps them."""
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    order = (torch.float32, torch.bfloat16)
    start = time.perf_counter()
    for i in range(MAX_ROUNDS):
        for dtype in order if i % 2 == 0 else order[::-1]:
            times[dtype].append(float(run(dtype)))
        if i + 1 >= MIN_ROUNDS and time.perf_counter() - start > PROBE_BUDGET_S:
            break
    fp32 = statistics.median(times[torch.float32])
    bf16 = statistics.median(times[torch.bfloat16])
    if not (fp32 > 0 and bf16 > 0):
        raise ValueError(f"the dtype probe timed {fp32!r} s in float32 and {bf16!r} s in bfloat16")
    ratio = fp32 / bf16
    return {
        "dtype": "bfloat16" if ratio >= MARGIN else "float32",
        "ratio": round(ratio, 4),
        "fp32_ms": round(fp32 * 1e3, 4),
        "bf16_ms": round(bf16 * 1e3, 4),
        "rounds": len(times[torch.float32]),
        "date": datetime.date.today().isoformat(),
    }


def _reason(entry: dict, threads: int, hidden: int, inter: int, rows: int) -> str:
    """One line with the numbers: ``bf16 1.62x fp32 (timed 2026-12-04, 2 threads; ...)``."""
    ratio = float(entry["ratio"])
    verdict = "" if entry["dtype"] == "bfloat16" else f", below the {MARGIN}x bf16 needs"
    return (
        f"bf16 {ratio:.2f}x fp32{verdict} (timed {entry['date']}, {threads} "
        f"thread{'s' if threads != 1 else ''}; {hidden}/{inter} products at {rows} rows: fp32 "
        f"{float(entry['fp32_ms']):.2f} ms, bf16 {float(entry['bf16_ms']):.2f} ms)"
    )


class _threads:
    """torch's thread count set to ``n`` inside, restored after."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.before = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.n != self.before:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        if torch.get_num_threads() != self.before:
            torch.set_num_threads(self.before)


def _product_timer(hidden: int, inter: int, rows: int) -> Timer:
    """A timer of the model's three product shapes (``hidden -> hidden``, ``hidden -> inter``,
    ``inter -> hidden``; q/k/v is three of the first) at ``rows`` rows, as the model computes
    them: float32 through :func:`bertattn.attention.gemm.linear` (MKL or oneDNN, as the process
    chose), bfloat16 through ``F.linear`` (oneDNN). Each dtype is run once before it is timed
    (oneDNN makes a kernel per shape on first use)."""
    from ..attention import gemm

    gen = torch.Generator().manual_seed(0)
    shapes = ((hidden, hidden), (hidden, inter), (inter, hidden))
    operands: dict[torch.dtype, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        operands[dtype] = [
            (
                torch.randn(rows, k, generator=gen).to(dtype),
                (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype),
                torch.zeros(n, dtype=dtype),
            )
            for k, n in shapes
        ]

    def once(dtype: torch.dtype) -> float:
        linear = gemm.linear if dtype == torch.float32 else F.linear
        with torch.inference_mode():
            start = time.perf_counter()
            for x, w, b in operands[dtype]:
                linear(x, w, b)
            return time.perf_counter() - start

    for dtype in operands:
        once(dtype)  # warm-up
    return once


def _device_type(device: str | torch.device) -> str:
    """``device``'s type; ``"auto"`` is CUDA when there is one. Not checked against the
    machine (:func:`bertattn.runtime.device.resolve_device` does that), so the rule for a device
    that is not here can be asked for."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device {device!r} is not valid; use 'auto', 'cpu', 'cuda', 'cuda:N' or a "
            f"torch.device."
        ) from None
