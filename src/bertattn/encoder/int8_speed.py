"""Whether int8 is worth it on this CPU, and in which form: each form of the int8 product
(:mod:`bertattn.encoder.int8_forms`) timed against the same float32 product, bounded, and checked
against the exact integer product; the fastest exact form 1.2x float32 or better is kept.

Timing first, then exactness, and only for a form that is fast: a reference kernel is caught
in a few milliseconds at 8 rows, where computing its 256-row product would take seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..runtime.cpu import cpu_flags, cpu_name
from .int8_forms import U8_F32, Form, candidates
from .int8_forms import error as form_error
from .int8_forms import exact as form_exact

__all__ = [
    "MIN_SPEEDUP",
    "SPEED_SHAPE",
    "SPEED_BUDGET_S",
    "SPEED_ROUNDS",
    "Speed",
    "time_speed",
    "time_forms",
    "check_speed",
]

log = logging.getLogger(__name__)

#: int8 is kept only where its product is at least this many times as fast as float32's: below,
#: its rounding buys nothing
MIN_SPEEDUP = 1.2
#: the product timed: MiniLM's first feed-forward linear (384 -> 1,536) at a batch's rows
SPEED_SHAPE = (256, 384, 1536)
#: the row counts timed on the way up: a reference kernel is caught at the first, small one
_LADDER = (8, 64)
#: int8 seconds (all its products together) after which the timing stops and the form is out
SPEED_BUDGET_S = 0.25
#: at a ladder step, int8 this many times slower than float32 is decided: out at once
_HOPELESS = 0.1
#: rounds of the two products at the full row count (the fastest of each kind is kept)
SPEED_ROUNDS = 5
#: a 16-bit output is kept over the best float32 output only when this many times as fast: its
#: rounding lands before the zero-point correction, which costs fidelity, and on a Zen 4 it
#: gained 5% (0.36 ms against 0.38)
HALF_OUT_GAIN = 1.15

#: a product timer: ``run(kind, rows)`` -> the seconds of one ``kind`` (``"int8"`` or
#: ``"float32"``) product of ``rows`` rows
SpeedRun = Callable[[str, int], float]


@dataclass(frozen=True)
class Speed:
    """One int8 product in one :class:`~bertattn.encoder.int8_forms.Form` against the same
    float32 product (:func:`time_speed`): the seconds of each, the shape, the CPU and thread
    count; ``stopped``: the timing stopped early (int8 past :data:`SPEED_BUDGET_S`, or
    hopeless), at ``rows`` rows; ``error``: the product's largest error relative to the exact
    integer product (None: not checked, because the form was not fast enough to matter)."""

    rows: int
    in_features: int
    out_features: int
    int8_s: float
    float32_s: float
    cpu: str
    threads: int
    stopped: bool = False
    form: Form = U8_F32
    error: float | None = None

    @property
    def ratio(self) -> float:
        """int8's speed over float32's (2.0: int8 twice as fast)."""
        return self.float32_s / self.int8_s if self.int8_s > 0 else float("inf")

    @property
    def exact(self) -> bool:
        """The product equals the exact one up to its output's rounding (True: not checked)."""
        return self.error is None or form_exact(self.form, self.error)

    def gflops(self, seconds: float) -> float:
        """The product's rate at ``seconds``, in GFLOP/s."""
        flops = 2.0 * self.rows * self.in_features * self.out_features
        return flops / seconds / 1e9 if seconds > 0 else float("inf")

    def passes(self) -> bool:
        return self.ratio >= MIN_SPEEDUP and self.exact

    def __str__(self) -> str:
        stop = f", timing stopped at {self.rows} rows" if self.stopped else ""
        wrong = "" if self.exact else f", NOT exact: off by {self.error:.2g} of its largest value"
        return (
            f"{self.form}: int8 {self.gflops(self.int8_s):.3g} GFLOP/s ({_ms(self.int8_s)}) "
            f"against float32 {self.gflops(self.float32_s):.3g} GFLOP/s "
            f"({_ms(self.float32_s)}): {self.ratio:.3g}x, a {self.rows}x{self.in_features} -> "
            f"{self.out_features} product, {self.threads} thread"
            f"{'s' if self.threads != 1 else ''}{stop}{wrong}"
        )


def _ms(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


class _Products:
    """The products :func:`time_speed` times, on random operands: ``Int8Linear.matmul`` in
    ``form`` (oneDNN's int8 kernel, without the fused steps around it, so no compiler is
    needed) and the float32 product the model computes (:func:`bertattn.attention.gemm.linear`)."""

    def __init__(self, rows: int, in_features: int, out_features: int, form: Form) -> None:
        from ..attention import gemm
        from .int8 import Int8Linear

        gen = torch.Generator().manual_seed(0)
        self.weight = torch.randn(out_features, in_features, generator=gen) * in_features**-0.5
        self.bias = torch.zeros(out_features)
        self.lin = Int8Linear(self.weight, self.bias, form=form)
        self.x = torch.randn(rows, in_features, generator=gen)
        self.codes = torch.randint(-128, 128, (rows, in_features), dtype=torch.int8, generator=gen)
        self.q = (self.codes + 128).to(torch.uint8) if form.unsigned else self.codes
        self._linear = gemm.linear

    def __call__(self, kind: str, n: int) -> float:
        with torch.inference_mode():
            start = time.perf_counter()
            if kind == "int8":
                self.lin.matmul(self.q[:n])
            else:
                self._linear(self.x[:n], self.weight, self.bias)
            return time.perf_counter() - start

    def error(self) -> float:
        """The int8 product's largest error against the exact one (see int8_forms.error)."""
        with torch.inference_mode():
            got = self.lin.matmul(self.q)
        return form_error(got, self.codes, self.lin.weight_int8, self.lin.weight_scale)


def time_speed(
    rows: int = SPEED_SHAPE[0],
    in_features: int = SPEED_SHAPE[1],
    out_features: int = SPEED_SHAPE[2],
    *,
    run: SpeedRun | None = None,
    budget_s: float = SPEED_BUDGET_S,
    form: Form = U8_F32,
) -> Speed:
    """Time one int8 product in ``form`` against float32 on this CPU, in well under a second
    where int8 is fast and bounded where it is not: first at a few rows (:data:`_LADDER`),
    stopping as soon as int8's products together pass ``budget_s`` or int8 is 10x slower than
    float32 (a reference kernel: ~1,000x), each step the fastest of three calls (a call
    preempted on a busy machine takes a scheduler's time slice, ~10 ms), then
    :data:`SPEED_ROUNDS` interleaved rounds at ``rows`` (the fastest of each kind: a call on a
    busy machine is only ever slower than its undisturbed time). Each product runs once
    untimed first (oneDNN makes a kernel per shape). A form fast enough to keep is then checked
    against the exact product (``Speed.error``). ``run``: instead of the real products,
    ``run(kind, rows)`` -> seconds (tests; no check)."""
    products = _Products(rows, in_features, out_features, form) if run is None else None
    timer: SpeedRun = products if products is not None else run  # type: ignore[assignment]
    speed = _time(timer, rows, in_features, out_features, budget_s, form)
    if products is not None and speed.ratio >= MIN_SPEEDUP:
        speed = replace(speed, error=products.error())
    return speed


def _time(
    run: SpeedRun, rows: int, in_features: int, out_features: int, budget_s: float, form: Form
) -> Speed:
    threads = torch.get_num_threads()

    def speed(n: int, t8: float, t32: float, stopped: bool) -> Speed:
        return Speed(n, in_features, out_features, t8, t32, cpu_name(), threads, stopped, form)

    spent = 0.0
    for n in (*[r for r in _LADDER if r < rows], rows):
        t8 = run("int8", n)  # the first call of this shape (not a timing, but it counts)
        spent += t8
        if spent > budget_s:
            return speed(n, t8, _warm(run, "float32", n), True)
        t8 = float("inf")
        for _ in range(3):  # the fastest of three: one call preempted must not decide
            t = run("int8", n)
            spent, t8 = spent + t, min(t8, t)
            if spent > budget_s:
                break
        t32 = _warm(run, "float32", n)
        if spent > budget_s or t8 * _HOPELESS > t32:
            return speed(n, t8, t32, True)
        if n == rows:
            eights, thirty_twos = [t8], [t32]
            for i in range(SPEED_ROUNDS - 1):
                pair = ("float32", "int8") if i % 2 == 0 else ("int8", "float32")
                for kind in pair:
                    (eights if kind == "int8" else thirty_twos).append(run(kind, n))
            # the fastest of each kind: a busy machine only ever adds time to a call, and a
            # median of calls mostly preempted refused int8 where it runs 1.4x (load ~10)
            return speed(n, min(eights), min(thirty_twos), False)
    raise AssertionError("unreachable")  # pragma: no cover


def _warm(run: SpeedRun, kind: str, n: int) -> float:
    """``run(kind, n)`` once untimed, then the fastest of three (a float32 product of a few
    rows takes well under a millisecond: one disturbed call must not make it look slow)."""
    run(kind, n)
    return min(run(kind, n) for _ in range(3))


def time_forms(forms: tuple[Form, ...] | None = None) -> tuple[Speed, ...]:
    """Each form this CPU offers (:func:`~bertattn.encoder.int8_forms.candidates` of its flags),
    timed by :func:`time_speed`: seconds where int8 is fast, bounded where it is not."""
    return tuple(time_speed(form=form) for form in forms or candidates(cpu_flags()))


#: this process's measurements, by thread count
_speeds: dict[int, tuple[Speed, ...]] = {}


def check_speed(speed: Speed | None = None) -> Speed:
    """The form int8 runs in here: the fastest of :func:`time_forms` that is exact and at
    least :data:`MIN_SPEEDUP` times as fast as float32 (measured once per process and thread
    count; ``speed``: judge that one measurement instead). Refuses (``ValueError``, naming
    every form's speeds, ratio and error, and the CPU) where none is."""
    if speed is not None:
        speeds: tuple[Speed, ...] = (speed,)
    else:
        threads = torch.get_num_threads()
        speeds = _speeds.get(threads) or ()
        if not speeds:
            speeds = _speeds[threads] = time_forms()
    kept = [s for s in speeds if s.passes()]
    if not kept:
        raise ValueError(refusal(speeds))
    best = _best(kept)
    log.info("int8 product on %s: %s", best.cpu, "; ".join(map(str, speeds)))
    log.info("int8 runs as %s (%.3gx float32's product)", best.form, best.ratio)
    return best


def _best(kept: list[Speed]) -> Speed:
    """The fastest float32-output form, unless a 16-bit output is :data:`HALF_OUT_GAIN` times
    faster still (or no float32 output passed)."""
    full = [s for s in kept if s.form.out == torch.float32]
    fastest = max(kept, key=lambda s: s.ratio)
    if not full:
        return fastest
    best = max(full, key=lambda s: s.ratio)
    return fastest if fastest.ratio >= HALF_OUT_GAIN * best.ratio else best


def refusal(speeds: tuple[Speed, ...]) -> str:
    """Why int8 is refused, with each form's numbers."""
    first = speeds[0]
    what = (
        "its int8 product is not faster than float32's"
        if len(speeds) == 1
        else f"none of the {len(speeds)} forms of its int8 product is both exact and faster "
        f"than float32's"
    )
    return (
        f"int8 is refused on this CPU ({first.cpu}): {what} by the {MIN_SPEEDUP}x int8 must "
        f"gain to be worth its rounding: {'; '.join(map(str, speeds))}. Load the model in "
        f"float32 (dtype='float32', or 'auto')."
    )
