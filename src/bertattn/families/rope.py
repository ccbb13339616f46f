"""The rotary settings of a ``config.json`` every rotary family reads the same way: the
``rope_parameters`` objects, ``rope_theta`` and the head size the rotation pairs up; and the
rotary attention every rotary family's layer builds (``rotary_attention``). Each check
raises what the family's ``refuse(field, value, expected)`` makes: a
:class:`~bertattn.errors.ModelFolderError` naming config.json, the field and what to write."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..attention import MultiHeadAttention
from ..errors import ModelFolderError

__all__ = ["Refuse", "even_head_size", "rope_object", "rope_theta", "rotary_attention"]

#: ``refuse(field, value, expected)``: the family's error for a field of config.json
Refuse = Callable[[str, object, str], ModelFolderError]


def rope_object(value: object, field: str, refuse: Refuse, expected: str) -> dict[str, Any]:
    """``value`` (``rope_parameters`` or one of its entries) as a dict, ``{}`` when absent
    (null); a list, string or number is refused naming ``field``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise refuse(field, value, expected)
    return value


def rope_theta(value: object, field: str, refuse: Refuse) -> float:
    """``value`` as a rotary base: a finite number > 0 (NaN, Infinity, 0, a bool refused)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise refuse(field, value, "a finite number > 0 (e.g. 10000.0)")
    return float(value)


def even_head_size(hidden: object, heads: object, refuse: Refuse) -> None:
    """The rotation pairs dimension i of a head with i + head_size/2: ``hidden / heads`` must
    be even. Sizes that are not ints, or do not divide, are left to BERT's own checks."""
    if isinstance(hidden, bool) or isinstance(heads, bool):
        return
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1 or hidden % heads:
        return
    if (hidden // heads) % 2:
        raise refuse(
            "num_attention_heads",
            heads,
            f"an even head size (rotary positions pair dimension i with i + head_size/2): "
            f"hidden_size / num_attention_heads = {hidden} / {heads} = {hidden // heads} is odd",
        )


def rotary_attention(
    config: Any, backend: str, theta: float, *, bias: bool, **extra: Any
) -> MultiHeadAttention:
    """A layer's attention of ``config``'s sizes and attention dropout, rotating its queries and
    keys with base ``theta``; its four projections biased when ``bias``. ``extra``: the family's
    other :class:`~bertattn.MultiHeadAttention` keywords (``window``, ``num_kv_heads``,
    ``head_dim``, ``scale``, ``causal``, ``qk_norm``, ``norm_eps``)."""
    return MultiHeadAttention(
        config.hidden_size,
        config.num_attention_heads,
        config.attention_probs_dropout_prob,
        bias=bias,
        backend=backend,
        rotary_theta=theta,
        **extra,
    )
