"""Recording the article's steps as the ``math`` backend runs them.

Inside ``with record_steps() as rec:``, every call of the ``math`` backend appends one
:class:`StepRecord` holding its own intermediate values — not a re-computation: the tensors the
reference path computed on the way to its output. Outside every such block the backend pays
one integer test per call.

Shapes (B batch, H heads, Lq / Lk query / key length, D head size, E embedding size):
    x        (B, Lq, E)   the module's input (the layer's hidden states)
    q        (B, H, Lq, D)
    k, v     (B, H, Lk, D)    with grouped-query heads: each key/value head already repeated
                              for the query heads it serves (math's sharing step)
    scores   (B, H, Lq, Lk)   q · k, before scaling (float32 for half inputs)
    scaled   (B, H, Lq, Lk)   scores / sqrt(D) (scores * scale with a module's own scale)
    bias     broadcastable to (B, H, Lq, Lk), or None: the mask as an additive bias (0 / -inf)
    weights  (B, H, Lq, Lk)   softmax(scaled + bias), before dropout
    context  (B, H, Lq, D)    weights @ v
    out_weight (E, E), out_bias (E,) | None: the output projection the merged heads go through
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["PositionSteps", "StepRecord", "StepRecorder", "record_steps", "recorder"]


@dataclass(kw_only=True)
class PositionSteps:
    """The position terms of a head's steps (None: the model has no such term), whole in a
    :class:`StepRecord` or cut to one head and query row in
    :class:`bertattn.encoder.steps.AttentionSteps`."""

    #: rotary positions: q and k before their rotation, and the rotation's base (None: none)
    q_before: Tensor | None = None
    k_before: Tensor | None = None
    theta: float | None = None
    #: the local window the band bias holds (None: every key)
    window: int | None = None
    #: DeBERTa's relative terms, scaled, added to ``scaled`` before the mask
    c2p: Tensor | None = None
    p2c: Tensor | None = None


@dataclass
class StepRecord(PositionSteps):
    """One ``math`` attention call (see the module docstring for the shapes; DeBERTa's
    ``c2p`` and ``p2c`` are ``(B, H, Lq, Lk)`` each)."""

    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor
    scaled: Tensor
    bias: Tensor | None
    weights: Tensor
    context: Tensor
    x: Tensor | None = None
    out_weight: Tensor | None = None
    out_bias: Tensor | None = None


@dataclass
class StepRecorder:
    """The records of one :func:`record_steps` block, in call order."""

    records: list[StepRecord] = field(default_factory=list)
    parent: StepRecorder | None = None  # an enclosing block sees the inner block's records
    _module: tuple[Tensor, Tensor, Tensor | None] | None = None
    _positions: tuple[Tensor, Tensor, float | None, int | None] | None = None

    def note_module(self, x: Tensor, out_weight: Tensor, out_bias: Tensor | None) -> None:
        """The calling module's input and output projection, for the next record."""
        self._module = (x, out_weight, out_bias)

    def note_positions(
        self, q: Tensor, k: Tensor, theta: float | None, window: int | None
    ) -> None:
        """The calling module's q and k before their rotation, its rotary base and window,
        for the next record."""
        self._positions = (q, k, theta, window)

    def add(self, record: StepRecord) -> None:
        if self._module is not None:
            record.x, record.out_weight, record.out_bias = self._module
            self._module = None
        if self._positions is not None:
            record.q_before, record.k_before, record.theta, record.window = self._positions
            self._positions = None
        self.records.append(record)
        if self.parent is not None:
            self.parent.records.append(record)


_active: ContextVar[StepRecorder | None] = ContextVar("bertattn_steps", default=None)
#: how many record_steps() blocks are open, in any thread: 0 lets a call skip the context variable
_open_blocks = 0
_blocks_lock = threading.Lock()


def recorder() -> StepRecorder | None:
    """The active recorder, or None outside :func:`record_steps` and while torch.compile /
    torch.export traces (a traced graph records nothing, and dynamo cannot trace a context
    variable)."""
    if torch.compiler.is_compiling() or not _open_blocks:
        return None
    return _active.get()


@contextlib.contextmanager
def record_steps() -> Iterator[StepRecorder]:
    """Record the intermediate values of every ``math`` attention call inside the block
    (blocks nest: an outer block also gets the records of an inner one)."""
    global _open_blocks
    rec = StepRecorder(parent=_active.get())
    token = _active.set(rec)
    with _blocks_lock:
        _open_blocks += 1
    try:
        yield rec
    finally:
        with _blocks_lock:
            _open_blocks -= 1
        _active.reset(token)
