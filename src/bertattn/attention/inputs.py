"""What a position scheme hands the attention: data, consumed at one seam.

The article's formula is ``softmax(Q K^T / sqrt(d_k) + mask) V``. Every architecture after BERT
changes one step of it: a rotation of Q and K by their positions (rotary), a band of keys
each query may see (a local window), a bias added to the scores (MPNet's relative positions).
Instead of one branch per scheme in ``MultiHeadAttention.forward``, a call gathers them into one
:class:`AttentionInputs` and :func:`check_inputs` asks the backend about each field given, by
name: a backend honours it or the call is refused with a message naming it.

The same seam carries what a module changes in the formula itself: a query that may not see
the future (causal), a score factor other than ``1 / sqrt(d_k)``, fewer key/value heads than
query heads (grouped-query, :mod:`.grouped`).

Who honours what (``BackendSpec.takes`` names what a backend does itself)::

    field      padded backends                       packed backends
    rotation   the module turns q and k (every one)  the module turns q and k (every one)
    window     a band in the mask, or exploited      the backend's ``window=`` (per sequence)
    bias       folded into the mask (every one)      the backend's ``bias=`` (a block each)
    causal     folded into the mask (every one)      the backend's ``causal=True``
    scale      the backend's ``scale=``              the backend's ``scale=``
    kv_heads   the backend, from k's and v's shape   the backend, from k's and v's shape
    relative   the backend's ``relative=``           the backend's ``relative=``

``relative`` is DeBERTa's disentangled attention (:mod:`.disentangled`): two more terms of the
scores, content-to-position and position-to-content, that depend on q and k themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from torch import Tensor

from .disentangled import RelativeTerms
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
        causal: query ``i`` sees key ``j`` only when ``j <= i`` (False: every key).
        scale: the scores' factor (None: the article's ``1 / sqrt(d_k)``).
        kv_heads: the key/value heads when fewer than the query heads (None: as many).
        relative: DeBERTa's relative terms of one layer (:class:`.disentangled.RelativeTerms`).
    """

    rotation: Rotation | None = None
    window: int | None = None
    bias: tuple[Tensor | None, ...] | None = None
    causal: bool = False
    scale: float | None = None
    kv_heads: int | None = None
    relative: RelativeTerms | None = None

    def given(self) -> tuple[str, ...]:
        """The names of the fields set (not None, not False), in declaration order."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return tuple(n for n, v in values if v is not None and v is not False)  # window 0 too

    def backend_kwargs(self, layout: str) -> dict[str, object]:
        """The keyword arguments a backend of ``layout`` receives: the fields given that it
        honours itself, passed by their names (``kv_heads`` it reads from k's shape)."""
        return {n: getattr(self, n) for n in self.given() if n in _KWARGS.get(layout, ())}


NO_INPUTS = AttentionInputs()

#: the fields a backend of each layout must honour itself (the others the module applies)
_BACKEND_FIELDS: dict[str, frozenset[str]] = {
    "padded": frozenset({"scale", "kv_heads", "relative"}),
    "packed": frozenset({"window", "bias", "causal", "scale", "kv_heads", "relative"}),
}
#: of those, the ones passed as keyword arguments
_KWARGS: dict[str, frozenset[str]] = {
    "padded": frozenset({"scale", "relative"}),
    "packed": frozenset({"window", "bias", "causal", "scale", "relative"}),
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
    "causal": (
        "backend {backend!r} cannot honour a causal mask (this module was built with "
        "causal=True); use backend 'varlen', 'sdpa', 'math' or 'auto'."
    ),
    "scale": (
        "backend {backend!r} takes no score scale, and this module has one (scale={value!r}, "
        "not 1/sqrt(head_dim)); use backend 'varlen', 'sdpa', 'math' or 'auto'."
    ),
    "kv_heads": (
        "backend {backend!r} cannot share key/value heads, and this module has {value} of "
        "them for more query heads (grouped-query); use backend 'varlen', 'sdpa', 'math' or "
        "'auto'."
    ),
    "relative": (
        "backend {backend!r} cannot add disentangled relative positions (DeBERTa's "
        "content-to-position and position-to-content terms), and this model has them; use "
        "backend 'varlen', 'sdpa', 'math' or 'auto'."
    ),
}


def check_inputs(spec: BackendSpec, inputs: AttentionInputs) -> None:
    """Refuse, by the field's name, an input the backend ``spec`` cannot honour."""
    own = _BACKEND_FIELDS.get(spec.layout, frozenset())
    for name in inputs.given():
        if name in own and not spec.honours(name):
            value = getattr(inputs, name)
            raise ValueError(_REFUSALS[name].format(backend=spec.name, value=value))
    if spec.layout == "packed" and inputs.window is not None:
        other = (
            "a bias"
            if inputs.bias is not None
            else "a causal mask"
            if inputs.causal
            else "disentangled positions"
            if inputs.relative is not None
            else ""
        )
        if other:
            raise ValueError(
                f"a packed call takes a window or {other}, not both; give the window as a band "
                f"in the bias blocks, or call without one of them."
            )
