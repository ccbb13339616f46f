"""The contract an encoder stack keeps with :class:`bertattn.BertModel`, written once.

The model reads the embeddings, prepares the padding mask (or packs the real tokens) once per
forward, and hands the hidden states to its encoder stack, whatever family built it (BERT's
:class:`~bertattn.families.bert_layers.BertEncoder`, the rotary families'
:class:`~bertattn.blocks.stack.RotaryEncoder`). A stack declares :class:`EncoderStack`::

    padded:  forward(hidden (B, L, E), mask, want, collect)   -> (B, L, E), weights per layer
    packed:  forward_packed(hidden (T, E), packing, collect)        -> (T, E)
    info:    StackInfo (what it can do: a packed path, a relative position bias, a lean path)

:class:`LayerStack` is the loop most stacks share: a stack inheriting it says how one layer
runs (padded and packed) and what the layers share per forward, and the loop over the layers,
the attention weights and ``collect`` are written once.

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
    "LayerStack",
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


class LayerStack(nn.Module, EncoderStack):
    """An :class:`EncoderStack` that runs its ``layers`` one after the other; a subclass says
    what its layers share per forward (:meth:`padded_state`, :meth:`packed_state`: None by
    default) and how one layer runs (:meth:`padded_layer`, :meth:`packed_layer`). No relative
    position bias unless a subclass gives one; :meth:`finish` (the identity here) runs after
    the last layer."""

    layers: nn.ModuleList

    def forward(
        self,
        hidden: Tensor,
        mask: PreparedMask,
        output_attentions: frozenset[int] = frozenset(),
        collect: list[Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, ...]]:
        """Padded: ``(B, L, E)`` -> ``(B, L, E)`` and per layer ``(B, H, L, L)`` weights for
        the layers in ``output_attentions`` (None for the others). ``collect``: when a list,
        each layer's output is appended to it."""
        state = self.padded_state(hidden, mask, output_attentions)
        attentions: list[Tensor | None] = []
        for i, layer in enumerate(self.layers):
            want = i in output_attentions
            hidden, weights = self.padded_layer(i, layer, hidden, mask, want, state)
            attentions.append(weights)
            if collect is not None:
                collect.append(hidden)
        return self.finish(hidden, collect), tuple(attentions)

    def forward_packed(
        self, hidden: Tensor, packing: Packing, collect: list[Tensor] | None = None
    ) -> Tensor:
        """Packed: the real tokens ``(T, E)`` -> ``(T, E)``, every layer on
        ``packing.backend``, no weights. ``collect``: as in :meth:`forward`, ``(T, E)`` each."""
        state = self.packed_state(hidden, packing)
        for i, layer in enumerate(self.layers):
            hidden = self.packed_layer(i, layer, hidden, packing, state)
            if collect is not None:
                collect.append(hidden)
        return self.finish(hidden, collect)

    def padded_state(
        self, hidden: Tensor, mask: PreparedMask, output_attentions: frozenset[int]
    ) -> Any:
        """What every layer of a padded forward shares, computed once (None: nothing)."""
        return None

    def packed_state(self, hidden: Tensor, packing: Packing) -> Any:
        """What every layer of a packed forward shares, computed once (None: nothing)."""
        return None

    def padded_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, mask: PreparedMask, want: bool, state: Any
    ) -> tuple[Tensor, Tensor | None]:
        """Layer ``i`` on padded ``hidden`` ``(B, L, E)``: its output and, when ``want``, its
        weights ``(B, H, L, L)`` (None otherwise)."""
        raise NotImplementedError

    def packed_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, packing: Packing, state: Any
    ) -> Tensor:
        """Layer ``i`` on the packed real tokens ``hidden`` ``(T, E)``: its output ``(T, E)``."""
        raise NotImplementedError

    def finish(self, hidden: Tensor, collect: list[Tensor] | None) -> Tensor:
        """The stack's output from the last layer's (the identity here)."""
        return hidden

    def compute_dtype(self, default: torch.dtype) -> torch.dtype:
        """The layers' compute dtype (their attention output projection's), ``default`` for a
        stack without layers."""
        return self.layers[0].attn.out_linear.weight.dtype if len(self.layers) else default

    def position_bias(self, length: int, dtype: torch.dtype) -> Tensor | None:
        """None: no relative position bias."""
        return None

    def relative_table(self) -> Tensor | None:
        """None: no relative position bias table (what the steps view asks a stack)."""
        return None


#: what :func:`missing_members` looks for, in the order a message names them
_MEMBERS = ("layers", "info", "forward", "forward_packed", "position_bias")


def missing_members(stack: object) -> list[str]:
    """The members of :class:`EncoderStack` that ``stack`` lacks (empty: none)."""
    return [name for name in _MEMBERS if not hasattr(stack, name)]
