"""Embedding tables that cost nothing to build on the ``meta`` device.

Checkpoints are loaded by building the model under ``torch.device("meta")`` and then assigning
the file's tensors. ``nn.Embedding`` initializes its table with ``normal_``, and on a meta tensor
that op runs a Python decomposition whose first call imports ``torch._dynamo``: about 1.3 s of a
command-line process's start (torch 2.13, measured on a 2-core EPYC), for a table that is
replaced at once. Built on meta, :func:`embedding` skips that initialization; on any other
device it is ``nn.Embedding`` itself, initialized as usual.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["embedding"]


def embedding(num: int, width: int, padding_idx: int | None = None) -> nn.Embedding:
    """``nn.Embedding(num, width, padding_idx=padding_idx)``; under ``torch.device("meta")``
    the same module with its (meta) table left uninitialized."""
    if torch.get_default_device().type == "meta":
        return nn.Embedding(num, width, padding_idx=padding_idx, _weight=torch.empty(num, width))
    return nn.Embedding(num, width, padding_idx=padding_idx)
