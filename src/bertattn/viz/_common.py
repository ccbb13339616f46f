"""Shared helpers of the visualizers: layer / head argument checks."""

from __future__ import annotations

from ..maps import AttentionMaps

__all__ = ["check_layer_head", "layer_index"]


def _range_text(ids: list[int]) -> str:
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def layer_index(maps: AttentionMaps, layer: int) -> int:
    """Position in ``maps.layers`` of the model's layer ``layer``.

    Raises ``ValueError`` starting with ``"layer N is out of range"`` and naming the valid ones
    (a CLI can prefix ``--`` to it).
    """
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {type(layer).__name__}")
    if layer not in maps.layer_ids:
        raise ValueError(
            f"layer {layer} is out of range: this model has layers {_range_text(maps.layer_ids)}"
        )
    return maps.layer_ids.index(layer)


def check_layer_head(maps: AttentionMaps, layer: int, head: int) -> int:
    """Validate ``layer`` (a model layer id) and ``head``; return the layer's position."""
    idx = layer_index(maps, layer)
    if isinstance(head, bool) or not isinstance(head, int):
        raise TypeError(f"head must be an int, got {type(head).__name__}")
    if not 0 <= head < maps.num_heads:
        raise ValueError(
            f"head {head} is out of range: this model has heads 0..{maps.num_heads - 1}"
        )
    return idx
