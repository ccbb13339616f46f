"""The encoder stack of the rotary architectures (ModernBERT, GTE, NomicBERT, Jina v3): a list
of :class:`~.block.EncoderBlock`, each with its :class:`~.rotary.LayerKind`, and an optional
final norm. It declares the encoder contract (:class:`~.contract.EncoderStack`), as BERT's
encoder does, so :class:`bertattn.BertModel` runs it padded or packed (every layer on the real
tokens only, positions restarting per sequence, the window never crossing a sequence)."""

from __future__ import annotations

from torch import Tensor, nn

from ..attention import PreparedMask
from ..attention.window import WindowedMask
from .block import EncoderBlock
from .contract import EncoderStack, Packing, StackInfo
from .rotary import LayerKind, RotaryTables, packed_positions

__all__ = ["RotaryEncoder"]


class RotaryEncoder(nn.Module, EncoderStack):
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

    def position_bias(self, length: int, dtype: object) -> Tensor | None:
        """None: no relative position bias here."""
        return None

    def relative_table(self) -> Tensor | None:
        """None: no relative position bias table (what the steps view asks BERT's stack)."""
        return None

    def _finish(self, hidden: Tensor, collect: list[Tensor] | None) -> Tensor:
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
            if collect is not None and collect:  # the last state is the normalized one
                collect[-1] = hidden
        return hidden

    def forward(
        self,
        hidden: Tensor,
        mask: PreparedMask,
        output_attentions: frozenset[int] = frozenset(),
        collect: list[Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor | None, ...]]:
        """Padded: ``(B, L, E)`` -> ``(B, L, E)`` and, per layer, ``(B, H, L, L)`` weights for
        the layers in ``output_attentions`` (None for the others)."""
        length = hidden.shape[1]
        rotations = self.tables.padded(self.kinds, length, hidden.device)
        masks: dict[int | None, PreparedMask | WindowedMask] = {None: mask}
        heads = self.layers[0].attn.num_heads if len(self.layers) else 1
        attentions: list[Tensor | None] = []
        for i, (layer, kind) in enumerate(zip(self.layers, self.kinds, strict=True)):
            if kind.window is not None and kind.window not in masks:  # once per window size
                cd = layer.attn.out_linear.weight.dtype
                masks[kind.window] = WindowedMask(mask, kind.window, length, heads=heads, dtype=cd)
            prepared = masks[kind.window]
            rotation = rotations.get(kind.theta)
            want = i in output_attentions
            got: list[Tensor | None] = [None]

            def attend(x: Tensor, layer=layer, prepared=prepared, rotation=rotation, want=want,
                       kind=kind, got=got) -> Tensor:  # fmt: skip
                out, weights = layer.attn.attend(x, prepared, need_weights=want, rotation=rotation)
                got[0] = weights
                return out

            hidden = layer(hidden, attend)
            attentions.append(got[0])
            if collect is not None:
                collect.append(hidden)
        return self._finish(hidden, collect), tuple(attentions)

    def forward_packed(
        self, hidden: Tensor, packing: Packing, collect: list[Tensor] | None = None
    ) -> Tensor:
        """Packed: ``(T, E)`` real tokens -> ``(T, E)``, every layer on ``packing.backend``,
        no weights."""
        packed = packing.batch
        rotations = self.tables.packed(self.kinds, packed_positions(packed, hidden.device))
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            rotation = rotations.get(kind.theta)

            def attend(x: Tensor, layer=layer, rotation=rotation, kind=kind) -> Tensor:
                return layer.attn.attend_packed(
                    x,
                    packed,
                    backend=packing.backend,
                    reason=packing.reason,
                    requested=layer.attn.backend,
                    rotation=rotation,
                    window=kind.window,
                )

            hidden = layer(hidden, attend)
            if collect is not None:
                collect.append(hidden)
        return self._finish(hidden, collect)
