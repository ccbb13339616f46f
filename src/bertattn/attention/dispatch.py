"""Which backend runs, and why: the ``auto`` rule and the record the user can ask for.

Two ways to see a decision:

* ``with bertattn.explain() as log: ...`` collects a :class:`Dispatch` for every attention call
  made inside the block (``log.records``, ``str(log)`` for a table);
* the logger ``"bertattn.dispatch"`` gets one DEBUG line per call.

Each attention module also keeps its latest decision in ``module.last_dispatch``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

logger = logging.getLogger("bertattn.dispatch")

__all__ = ["Dispatch", "DispatchLog", "explain", "choose_backend", "record"]


@dataclass(frozen=True)
class Dispatch:
    """One attention call: the backend asked for, the one that ran, and why."""

    requested: str
    backend: str
    reason: str
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def __str__(self) -> str:
        shape = "x".join(str(s) for s in self.shape)
        return f"{self.backend:<7} (asked {self.requested}; {shape} {self.dtype}): {self.reason}"


@dataclass
class DispatchLog:
    """The decisions recorded inside one :func:`explain` block, in call order."""

    records: list[Dispatch] = field(default_factory=list)

    def backends(self) -> list[str]:
        """The backend that ran, per call."""
        return [r.backend for r in self.records]

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.records) or "(no attention call recorded)"


_active: ContextVar[DispatchLog | None] = ContextVar("bertattn_explain", default=None)


@contextlib.contextmanager
def explain() -> Iterator[DispatchLog]:
    """Record which attention backend ran for every call inside the block, and why."""
    log = DispatchLog()
    token = _active.set(log)
    try:
        yield log
    finally:
        _active.reset(token)


def record(decision: Dispatch) -> None:
    """Publish a decision to the active :func:`explain` block and the debug logger."""
    log = _active.get()
    if log is not None:
        log.records.append(decision)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", decision)


#: ``auto`` packs a padded batch (backend ``varlen``) when at least this share of it is padding.
#: Chosen from measurements (README, "Performance"; ``python -m benchmarks.varlen_threshold``):
#: on MiniLM, B=32, L=128 (2-core CPU) packing was even at 0-5% padding (0.97-1.05x), 1.05x at
#: 10%, 1.22x at 20% and 1.68x at 40%.
VARLEN_MIN_PAD_FRACTION = 0.10


def choose_backend(
    requested: str,
    *,
    need_weights: bool,
    pad_fraction: float | None = None,
    device_type: str = "cpu",
) -> tuple[str, str]:
    """The ``auto`` rule: ``(backend, reason)``; an explicit request is kept as it is.

    ``pad_fraction`` is given only by callers that can pack their batch (an encoder with a
    key padding mask and no other mask): the share of the padded batch that is padding.
    Packing is chosen on CPU only; on CUDA the padded batch measured as fast or faster.
    """
    if requested != "auto":
        return requested, "asked for explicitly"
    if need_weights:
        return "math", "attention weights requested (need_weights=True); only math returns them"
    if pad_fraction is not None and device_type != "cpu":
        return "sdpa", (
            f"{pad_fraction:.0%} padding, but on {device_type} packing measured no faster "
            f"(BERT-base B=16 on an H200 is launch-bound; benchmarks/gpu.py): padded fused SDPA"
        )
    if pad_fraction is not None and pad_fraction >= VARLEN_MIN_PAD_FRACTION:
        return "varlen", (
            f"{pad_fraction:.0%} of the batch is padding (>= {VARLEN_MIN_PAD_FRACTION:.0%}): "
            f"packed real tokens, no compute on padding"
        )
    why = "no weights needed: fused scaled_dot_product_attention"
    if pad_fraction is not None:
        why += f" ({pad_fraction:.0%} padding is below {VARLEN_MIN_PAD_FRACTION:.0%}: not packed)"
    return "sdpa", why
