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
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from . import policy as _policy

logger = logging.getLogger("bertattn.dispatch")

__all__ = ["Dispatch", "DispatchLog", "explain", "choose_backend", "record", "recording"]


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
    #: other choices made inside the block, one line each (e.g. the CPU threads an encode ran with)
    notes: list[str] = field(default_factory=list)

    def backends(self) -> list[str]:
        """The backend that ran, per call."""
        return [r.backend for r in self.records]

    def __str__(self) -> str:
        lines = [str(r) for r in self.records] or ["(no attention call recorded)"]
        return "\n".join(lines + self.notes)


_active: ContextVar[DispatchLog | None] = ContextVar("bertattn_explain", default=None)
#: how many explain() blocks are open, in any thread: 0 lets a call skip the context variable
_open_blocks = 0
_blocks_lock = threading.Lock()


@contextlib.contextmanager
def explain() -> Iterator[DispatchLog]:
    """Record which attention backend ran for every call inside the block, and why."""
    global _open_blocks
    log = DispatchLog()
    token = _active.set(log)
    with _blocks_lock:
        _open_blocks += 1
    try:
        yield log
    finally:
        with _blocks_lock:
            _open_blocks -= 1
        _active.reset(token)


def recording() -> bool:
    """Whether a decision would go anywhere: an open :func:`explain` block or the DEBUG logger.
    When False a caller need not build its :class:`Dispatch` at all."""
    return (_open_blocks and _active.get() is not None) or logger.isEnabledFor(logging.DEBUG)


def explaining() -> bool:
    """Whether an :func:`explain` block is open in this context (a caller can skip building
    a :func:`note` when not)."""
    return bool(_open_blocks) and _active.get() is not None


def note(text: str, *, once: bool = False) -> None:
    """Add a line to the active :func:`explain` block (nothing when none is open); ``once``:
    not when the block already has that line."""
    log = _active.get() if _open_blocks else None
    if log is not None and not (once and text in log.notes):
        log.notes.append(text)


def record(decision: Dispatch) -> None:
    """Publish a decision to the active :func:`explain` block and the debug logger."""
    log = _active.get() if _open_blocks else None
    if log is not None:
        log.records.append(decision)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", decision)


#: ``auto`` packs a padded batch (backend ``varlen``) when at least this share of it is padding:
#: the CPU threshold of the policy table. ``auto`` reads the table
#: (:mod:`bertattn.attention.policy`), not this name: change a threshold there.
#: Chosen from measurements (docs/performance.md; ``python -m benchmarks.varlen_threshold``):
#: on MiniLM, B=32, L=128 (2-core CPU) packing was even at 0-5% padding (0.97-1.05x), 1.05x at
#: 10%, 1.22x at 20% and 1.68x at 40%.
VARLEN_MIN_PAD_FRACTION = _policy.CPU_VARLEN_MIN_PAD

_SDPA_WHY = "no weights needed: fused scaled_dot_product_attention"
_WEIGHTS_WHY = "attention weights requested (need_weights=True); only math returns them"
_EXPLICIT_WHY = "asked for explicitly"

#: memo of the ``auto`` decisions without a padding share and without weights:
#: ``(device_type, dtype, key_len, training) -> (backend, reason)``, valid for one policy table
#: object (the table is an immutable tuple: a new table is a new object)
_memo: dict[tuple[object, ...], tuple[str, str]] = {}
_memo_table: tuple[_policy.Rule, ...] | None = None


def choose_backend(
    requested: str,
    *,
    need_weights: bool,
    pad_fraction: float | None = None,
    device_type: str = "cpu",
    dtype: torch.dtype | None = None,
    key_len: int | None = None,
    training: bool = False,
) -> tuple[str, str]:
    """The ``auto`` rule: ``(backend, reason)``; an explicit request is kept as it is.

    ``pad_fraction`` is given only by callers that can pack their batch (an encoder with a
    key padding mask and no other mask): the share of the padded batch that is padding.
    ``dtype`` and ``key_len`` pick the row of the policy table
    (:mod:`bertattn.attention.policy`); without them the device's catch-all row applies.
    ``training`` (dropout active): the table's ``math`` choice, measured in inference, is not
    taken; fused SDPA runs.
    """
    if requested != "auto":
        return requested, _EXPLICIT_WHY
    if need_weights:
        return "math", _WEIGHTS_WHY
    global _memo_table
    table = _policy.TABLE
    if pad_fraction is None and torch.compiler.is_compiling():  # no memo: nothing to guard on
        return _padded_choice(_traced_rule(device_type, dtype, key_len, table), training)
    if pad_fraction is None:
        key = (device_type, dtype, key_len, training)
        if table is _memo_table:
            hit = _memo.get(key)
            if hit is not None:
                return hit
        else:
            _memo.clear()
            _memo_table = table
        decision = _padded_choice(_policy.lookup(device_type, dtype, key_len, table), training)
        if len(_memo) > 512:  # distinct lengths are unbounded: keep the memo small
            _memo.clear()
        _memo[key] = decision
        return decision
    rule = _policy.lookup(device_type, dtype, key_len, table)
    if rule.varlen_min_pad is None:
        if device_type != "cpu":
            return "sdpa", (
                f"{pad_fraction:.0%} padding, but on {device_type} packing measured no faster "
                f"(BERT-base B=16 on an H200 is launch-bound; benchmarks/gpu.py): padded fused SDPA"
            )
        return "sdpa", f"{pad_fraction:.0%} padding, but the policy table never packs here"
    if pad_fraction >= rule.varlen_min_pad:
        return "varlen", (
            f"{pad_fraction:.0%} of the batch is padding (>= {rule.varlen_min_pad:.0%}): "
            f"packed real tokens, no compute on padding"
        )
    return "sdpa", (
        f"{_SDPA_WHY} ({pad_fraction:.0%} padding is below {rule.varlen_min_pad:.0%}: not packed)"
    )


def _traced_rule(
    device_type: str,
    dtype: torch.dtype | None,
    key_len: int | None,
    table: tuple[_policy.Rule, ...],
) -> _policy.Rule:
    """The rule for a call being traced (torch.compile / export), where ``key_len`` may be
    symbolic: when every size class gives the same kernel the length is not looked at, so
    the compiled graph gets no guard on it (no recompile per size class)."""
    rules = [
        _policy.lookup_class(device_type, dtype, name, table) for name, _ in _policy.SIZE_CLASSES
    ]
    if all(r.kernel == rules[0].kernel for r in rules):
        return rules[0]
    return _policy.lookup(device_type, dtype, key_len, table)


def _padded_choice(rule: _policy.Rule, training: bool) -> tuple[str, str]:
    if rule.kernel == "math" and not training:
        return "math", (
            f"no weights needed, but math (matmul + softmax) measured faster than fused SDPA "
            f"here (policy: {rule.device} {rule.dtype} {rule.size})"
        )
    return "sdpa", _SDPA_WHY
