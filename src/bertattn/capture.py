"""Whether the ops now being issued are recorded for replay (a CUDA graph being captured).

A captured graph replays the kernels of one call with whatever the static input buffers hold
at replay time, so the captured code must not branch on tensor values: reading a value back
(``bool(t.all())``, ``.item()``, ``.tolist()``) synchronizes the device, which is not allowed
while a stream is capturing, and the branch taken would be frozen into every replay. The mask
preparation (:mod:`bertattn.attention.masks`) and the encoder's packing decision ask
:func:`is_capturing` and take their branch-free form, as they do under ``torch.compile``; the
argument checks (:func:`bertattn.arguments.values_checkable`) skip reading values. It depends on
torch alone, so that low-level modules can ask it (``bertattn.attention.capture`` re-exports it).

Two ways in: torch's own ``torch.cuda.graph`` (asked of CUDA only: the check costs nothing on
the CPU path) and :func:`capturing`, the block that :class:`bertattn.encoder.graphs.GraphedBert`
opens around its capture (and that a test's stand-in for a graph opens on the CPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["capturing", "is_capturing"]

#: open :func:`capturing` blocks (a list so the module keeps one mutable cell)
_DEPTH = [0]


@contextmanager
def capturing() -> Iterator[None]:
    """Mark the ops issued inside as recorded for replay (nests)."""
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1


def is_capturing(device: torch.device | None = None) -> bool:
    """True inside :func:`capturing`, or when ``device`` is a CUDA device whose current stream
    is capturing a graph."""
    if _DEPTH[0]:
        return True
    return device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()
