"""Feed-forwards: the plain one (BERT's, Jina v3's: E -> I, activation, I -> E) and the gated one
(ModernBERT's GeGLU, GTE's and NomicBERT's GLU: two projections to I, one activated, their
product back to E).

Which half is activated differs between checkpoints (ModernBERT's fused ``Wi`` activates its
first half, GTE activates ``gate_proj`` and multiplies ``up_proj``): here the input projection
``w_in`` is always ``(2I, E)`` with the ACTIVATED half first, and each family's name map puts
its checkpoint's halves in that order when it loads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "FeedForward", "GatedFeedForward", "activation"]


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


#: Hugging Face activation names -> the function
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str, field: str = "hidden_act") -> Callable[[Tensor], Tensor]:
    """The activation called ``name`` in a config; an unknown one: ValueError naming ``field``."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"{field}={name!r} is not supported; bertattn implements {', '.join(ACTIVATIONS)}."
        ) from None


class FeedForward(nn.Module):
    """``(..., E) -> (..., E)``: ``fc_out(act(fc_in(x)))``, dropout after (training only)."""

    def __init__(
        self, width: int, inner: int, act: str, *, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.fc_in = nn.Linear(width, inner, bias=bias)
        self.fc_out = nn.Linear(inner, width, bias=bias)
        self.act = activation(act)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(x))))  # (..., E)


class GatedFeedForward(nn.Module):
    """``(..., E) -> (..., E)``: ``w_out(act(a) * g)`` with ``(a, g) = w_in(x)`` split in halves
    (the activated half first, see the module docstring); dropout on the product (training)."""

    def __init__(
        self,
        width: int,
        inner: int,
        act: str,
        *,
        bias_in: bool = False,
        bias_out: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.w_in = nn.Linear(width, 2 * inner, bias=bias_in)
        self.w_out = nn.Linear(inner, width, bias=bias_out)
        self.act = activation(act)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        a, g = self.w_in(x).chunk(2, dim=-1)  # (..., I) each: activated, gate
        return self.w_out(self.dropout(self.act(a) * g))  # (..., E)
