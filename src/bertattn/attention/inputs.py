"""What a position scheme hands the attention: data, consumed at one seam.

The article's formula is ``softmax(Q K^T / sqrt(d_k) + mask) V``. Every architecture after BERT
changes one step of it: a rotation of Q and K by their positions (rotary), a band of keys
each query may see (a local window), a bias added to the scores (MPNet's relative positions).
Instead of one branch per scheme in ``MultiHeadAttention.forward``, a call gathers them into one
:class:`AttentionInputs` and :func:`check_inputs` asks the backend about each field given, by
name: a backend honours it or the call is refused with a message naming it.

Who honours what (``BackendSpec.takes`` names what a backend does itself)::

    field      padded backends                       packed backends
    rotation   the module turns q and k (every one)  the module turns q and k (every one)
    window     a band in the mask, or exploited      the backend's ``window=`` (per sequence)
    bias       folded into the mask (every one)      the backend's ``bias=`` (a block each)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from torch import Tensor

from .rotary import Rotation

if TYPE_CHECKING:
    from .backends import BackendSpec

__all__ = ["AttentionInputs", "check_inputs", "NO_INPUTS"]


@dataclass(frozen=True)
class AttentionInputs:
    """The position inputs of one attention call (all optional; none: the article).

    Attributes:
        rotation: rotary tables for q and k (:mod:`.rotary`): ``(L, D)`` / ``(B, 1, L, D)``
            padded, ``(T, 1, D)`` packed.
        window: local attention, query ``i`` sees key ``j`` when ``|i - j| <= window``.
        bias: a packed call's additive bias, one ``(1, H, l, l)`` block per sequence (None for
            an empty one); a padded call carries its bias in the prepared mask instead.
    """

    rotation: Rotation | None = None
    window: int | None = None
    bias: tuple[Tensor | None, ...] | None = None

    def given(self) -> tuple[str, ...]:
        """The names of the fields set, in declaration order."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)

    def packed_kwargs(self) -> dict[str, object]:
        """The keyword arguments a packed backend receives: the fields it must honour itself
        (the rotation is applied before, by the module)."""
        return {n: getattr(self, n) for n in self.given() if n in _BACKEND_FIELDS["packed"]}


NO_INPUTS = AttentionInputs()

#: the fields a backend of each layout must honour itself (the others the module applies)
_BACKEND_FIELDS: dict[str, frozenset[str]] = {
    "padded": frozenset(),
    "packed": frozenset({"window", "bias"}),
}

#: a refusal per field, ``{backend}`` filled in: what came, why it cannot run, the fix
_REFUSALS: dict[str, str] = {
    "bias": (
        "backend {backend!r} takes no attention bias, and this model adds one (MPNet's relative "
        "position bias); use backend 'varlen', 'sdpa', 'math' or 'auto'."
    ),
    "window": (
        "backend {backend!r} cannot honour a local attention window (this model has one); use "
        "backend 'varlen', 'sdpa', 'math' or 'auto'."
    ),
}


def check_inputs(spec: BackendSpec, inputs: AttentionInputs) -> None:
    """Refuse, by the field's name, an input the backend ``spec`` cannot honour."""
    own = _BACKEND_FIELDS.get(spec.layout, frozenset())
    for name in inputs.given():
        if name in own and not spec.honours(name):
            raise ValueError(_REFUSALS[name].format(backend=spec.name))
    if spec.layout == "packed" and inputs.window is not None and inputs.bias is not None:
        raise ValueError(
            "a packed call takes a window or a bias, not both; give the window as a band in "
            "the bias blocks, or call without one of them."
        )
