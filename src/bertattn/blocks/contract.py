"""The contract an encoder stack keeps with :class:`bertattn.BertModel`, written once.

The model reads the embeddings, prepares the padding mask (or packs the real tokens) once per
forward, and hands the hidden states to its encoder stack, whatever family built it (BERT's
:class:`~bertattn.families.bert_layers.BertEncoder`, the rotary families'
:class:`~bertattn.blocks.stack.RotaryEncoder`). A stack declares :class:`EncoderStack`::

    padded:  forward(hidden (B, L, E), mask, want, collect)   -> (B, L, E), weights per layer
    packed:  forward_packed(hidden (T, E), packing, collect)        -> (T, E)
    info:    StackInfo (what it can do: a packed path, a relative position bias, a lean path)

Fast paths are keyed on what a layer class declares it offers (:class:`SpeedPaths`, asked with
:func:`offers`), not on its class.

Whether a forward packs is decided once, by the model (:func:`packs` is the one place a
backend's layout is asked), and handed down as a :class:`Packing`: the stack and its layers
run the packed backend it names and never decide again.

B batch, L sequence length, E hidden size, T the batch's real tokens, H heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..attention import PreparedMask, get_backend
from ..attention.padding import PackedBatch

__all__ = [
    "INT8",
    "LEAN",
    "EncoderStack",
    "Packing",
    "SpeedPaths",
    "StackInfo",
    "missing_members",
    "offers",
    "packs",
]

#: a layer that runs as plain tensor ops when its ``lean()`` finds its modules stock:
#: ``forward(x, mask, need_weights, lean=True)`` and ``forward_packed(x, packing, lean=True)``
LEAN = "lean"
#: a layer int8 (:mod:`bertattn.encoder.int8`) may rebuild from its modules: ``attn`` (q/k/v
#: and out_linear), ``attn_norm``, ``mlp`` (fc_in, exact GELU, fc_out) and ``mlp_norm``
INT8 = "int8"


class SpeedPaths:
    """A layer class's declaration of the fast paths it offers (:data:`LEAN`, :data:`INT8`),
    in ``speed_paths``. A subclass offers none unless it declares its own: an inherited
    declaration would vouch for a forward the subclass may have changed."""

    speed_paths: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.speed_paths = frozenset(cls.__dict__.get("speed_paths", ()))


def offers(layer: object, path: str) -> bool:
    """Whether ``layer``'s class declares the fast ``path`` (:class:`SpeedPaths`)."""
    return path in getattr(type(layer), "speed_paths", ())


def packs(backend: str) -> bool:
    """Whether ``backend`` (a registered name or ``"auto"``) works on packed real tokens
    (``varlen``, or one registered with ``layout="packed"``): the encoder's packing decision
    asks this, once per forward."""
    return backend != "auto" and get_backend(backend).layout == "packed"


@dataclass(frozen=True)
class Packing:
    """The packing of one forward, decided once by the model and handed to every layer.

    Attributes:
        batch: where the real tokens are (:class:`~bertattn.attention.padding.PackedBatch`;
            the hidden states are ``(T, E)``).
        backend: the packed backend every layer runs (the one asked for, or ``varlen`` for
            ``auto``).
        reason: why this forward packs (what ``explain()`` says).
    """

    batch: PackedBatch
    backend: str
    reason: str


@dataclass(frozen=True)
class StackInfo:
    """What an encoder stack can do, read by the model once per forward.

    Attributes:
        packed: :meth:`EncoderStack.forward_packed` runs (False: the model never packs for it;
            an explicit packed backend is refused by the stack's name).
        relative_bias: the stack adds a relative position bias to every layer's scores
            (MPNet): the model asks :meth:`EncoderStack.position_bias` for the padded form.
        lean: the stack may run its layers as plain tensor ops when they are stock
            (``BertLayer.forward(..., lean=True)``).
    """

    packed: bool = True
    relative_bias: bool = False
    lean: bool = False


@runtime_checkable
class EncoderStack(Protocol):
    """An encoder stack :class:`bertattn.BertModel` runs (see the module docstring)."""

    #: the stack's layers, each with an ``attn`` (:class:`bertattn.MultiHeadAttention`)
    layers: nn.ModuleList

    @property
    def info(self) -> StackInfo:
        """What this stack can do (:class:`StackInfo`)."""
        ...

    def forward(
        self,
        hidden: Tensor,
        mask: PreparedMask,
        output_attentions: frozenset[int] = frozenset(),
        collect: list[Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, ...]]:
        """Padded: ``hidden`` ``(B, L, E)`` -> ``(B, L, E)``, and one entry per layer:
        ``(B, H, L, L)`` weights for the layers in ``output_attentions``, None for the others.
        ``mask`` is prepared once by the model (padding, and the relative bias when
        :attr:`StackInfo.relative_bias`). ``collect``: when a list, each layer's output
        ``(B, L, E)`` is appended to it."""
        ...

    def forward_packed(
        self, hidden: Tensor, packing: Packing, collect: list[Tensor] | None = None
    ) -> Tensor:
        """Packed: the real tokens ``hidden`` ``(T, E)`` -> ``(T, E)``, each sequence of
        ``packing.batch`` attending to its own tokens only, every layer on ``packing.backend``;
        no weights. ``collect``: as in :meth:`forward`, ``(T, E)`` each."""
        ...

    def position_bias(self, length: int, dtype: torch.dtype) -> Tensor | None:
        """The relative position bias of a padded batch of ``length`` tokens,
        ``(1, H, L, L)`` in ``dtype``, computed once per forward; None without one."""
        ...


#: what :func:`missing_members` looks for, in the order a message names them
_MEMBERS = ("layers", "info", "forward", "forward_packed", "position_bias")


def missing_members(stack: object) -> list[str]:
    """The members of :class:`EncoderStack` that ``stack`` lacks (empty: none)."""
    return [name for name in _MEMBERS if not hasattr(stack, name)]
