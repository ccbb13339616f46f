"""The encoder stack of the rotary architectures (ModernBERT, GTE, NomicBERT, Jina v3): a list
of :class:`~.block.EncoderBlock`, each with its :class:`~.rotary.LayerKind`, and an optional
final norm. It declares the encoder contract (:class:`~.contract.EncoderStack`), as BERT's
encoder does, so :class:`bertattn.BertModel` runs it padded or packed (every layer on the real
tokens only, positions restarting per sequence, the window never crossing a sequence)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..attention import PreparedMask
from ..attention.window import WindowedMask
from .block import EncoderBlock
from .contract import LayerStack, Packing, StackInfo
from .rotary import LayerKind, RotaryTables, packed_positions

__all__ = ["RotaryEncoder"]


class RotaryEncoder(LayerStack):
    """``layers`` with their ``kinds`` (one each), then ``final_norm`` (None: none)."""

    def __init__(
        self, layers: list[EncoderBlock], kinds: list[LayerKind], final_norm: nn.Module | None
    ) -> None:
        super().__init__()
        if len(layers) != len(kinds):
            raise ValueError(f"{len(layers)} layers but {len(kinds)} layer kinds; give one each.")
        self.layers = nn.ModuleList(layers)
        self.kinds = list(kinds)
        self.final_norm = final_norm
        head_dim = layers[0].attn.head_dim if layers else 2
        self.tables = RotaryTables(head_dim)

    @property
    def info(self) -> StackInfo:
        """Packed: yes; no relative position bias (positions rotate the queries and keys); no
        lean path."""
        return StackInfo(packed=True, relative_bias=False, lean=False)

    def finish(self, hidden: Tensor, collect: list[Tensor] | None) -> Tensor:
        """The final norm, when there is one (it replaces the last collected state)."""
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
            if collect is not None and collect:  # the last state is the normalized one
                collect[-1] = hidden
        return hidden

    def padded_state(
        self, hidden: Tensor, mask: PreparedMask, output_attentions: frozenset[int]
    ) -> tuple[dict, dict[int | None, PreparedMask | WindowedMask]]:
        """The rotations per base ``(L, D)`` and the mask per window (None: the full mask;
        each window's is added by its first layer)."""
        rotations = self.tables.padded(self.kinds, hidden.shape[1], hidden.device)
        return rotations, {None: mask}

    def padded_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, mask: PreparedMask, want: bool, state: Any
    ) -> tuple[Tensor, Tensor | None]:
        """Layer ``i`` with its kind's rotation and window mask."""
        rotations, masks = state
        kind = self.kinds[i]
        if kind.window is not None and kind.window not in masks:  # once per window size
            heads, cd = self.layers[0].attn.num_heads, layer.attn.out_linear.weight.dtype
            length = hidden.shape[1]
            masks[kind.window] = WindowedMask(mask, kind.window, length, heads=heads, dtype=cd)
        return layer.run_padded(hidden, masks[kind.window], want,
                                rotation=rotations.get(kind.theta))  # fmt: skip

    def packed_state(self, hidden: Tensor, packing: Packing) -> dict:
        """The rotations per base, at each token's position in its own sequence."""
        return self.tables.packed(self.kinds, packed_positions(packing.batch, hidden.device))

    def packed_layer(
        self, i: int, layer: nn.Module, hidden: Tensor, packing: Packing, state: Any
    ) -> Tensor:
        """Layer ``i`` on ``packing.backend`` with its kind's rotation and window."""
        kind = self.kinds[i]
        return layer.run_packed(hidden, packing, rotation=state.get(kind.theta),
                                window=kind.window)  # fmt: skip
