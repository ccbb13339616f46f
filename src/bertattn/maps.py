"""``AttentionMaps``: tokens and per-layer attention weights as plain data.

The BERT side fills it, the visualizers draw it; neither knows the other. Shapes::

    tokens:  L strings
    layers:  one float32 numpy array (H, L, L) per layer, rows = queries, columns = keys
    qkv:     optional, per model layer id {"q", "k", "v"}: float32 (H, L, D) each — the
             projections the math backend attended with (for the page's step view)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["AttentionMaps"]


@dataclass
class AttentionMaps:
    """Attention weights of one text, per layer, with the tokens they are about.

    Attributes:
        tokens: the L token strings, in order (special tokens included).
        layers: per layer an ``(H, L, L)`` float32 array (query rows, key columns).
        layer_ids: the model's layer index of each entry of ``layers`` (default 0..n-1).
        segment_start: index of the first token of the second segment (a text pair), or None.
        model_name: where the weights came from, for titles.
        qkv: for some layer ids, the ``q``, ``k``, ``v`` projections, each ``(H, L, D)``
            float32 (what the step view recomputes the weights from); empty by default.
    """

    tokens: list[str]
    layers: list[np.ndarray]
    layer_ids: list[int] = field(default_factory=list)
    segment_start: int | None = None
    model_name: str = ""
    qkv: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = [str(t) for t in self.tokens]
        self.layers = [np.asarray(_to_numpy(a), dtype=np.float32) for a in self.layers]
        if not self.layer_ids:
            self.layer_ids = list(range(len(self.layers)))
        self.qkv = {
            int(i): {name: np.asarray(_to_numpy(a), dtype=np.float32) for name, a in d.items()}
            for i, d in self.qkv.items()
        }
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` if the maps do not fit the tokens or each other."""
        n = len(self.tokens)
        if n == 0:
            raise ValueError("AttentionMaps needs at least one token; got an empty token list.")
        if not self.layers:
            raise ValueError("AttentionMaps needs at least one layer of weights; got none.")
        if len(self.layer_ids) != len(self.layers):
            raise ValueError(
                f"layer_ids has {len(self.layer_ids)} entries for {len(self.layers)} layers."
            )
        heads = None
        for i, a in zip(self.layer_ids, self.layers, strict=True):
            if a.ndim != 3 or a.shape[1] != n or a.shape[2] != n:
                raise ValueError(
                    f"layer {i} weights have shape {tuple(a.shape)}; expected (heads, {n}, {n}) "
                    f"for {n} tokens. Pass one (H, L, L) array per layer for a single text "
                    f"(take [0] of a batched (B, H, L, L) tensor)."
                )
            if heads is not None and a.shape[0] != heads:
                raise ValueError(f"layer {i} has {a.shape[0]} heads, earlier layers {heads}.")
            heads = a.shape[0]
        if self.segment_start is not None and not 0 < self.segment_start < n:
            raise ValueError(f"segment_start {self.segment_start} is outside 1..{n - 1}.")
        self._validate_qkv()

    def _validate_qkv(self) -> None:
        n, h = len(self.tokens), self.layers[0].shape[0]
        for i, d in self.qkv.items():
            if i not in self.layer_ids:
                raise ValueError(f"qkv has layer {i}, which has no weights in layer_ids.")
            if sorted(d) != ["k", "q", "v"]:
                raise ValueError(f"qkv[{i}] must hold 'q', 'k' and 'v'; got {sorted(d)}.")
            shapes = {a.shape for a in d.values()}
            shape = next(iter(shapes))
            if len(shapes) != 1 or len(shape) != 3 or shape[:2] != (h, n):
                raise ValueError(
                    f"qkv[{i}] arrays must each be (H={h}, L={n}, D); got "
                    f"{[d[k].shape for k in ('q', 'k', 'v')]}."
                )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return int(self.layers[0].shape[0])

    def layer(self, layer_id: int) -> np.ndarray:
        """The ``(H, L, L)`` weights of the model's layer ``layer_id``."""
        if layer_id not in self.layer_ids:
            raise ValueError(f"layer {layer_id} is not in these maps; they hold {self.layer_ids}.")
        return self.layers[self.layer_ids.index(layer_id)]

    @classmethod
    def from_model_output(
        cls,
        tokens: Sequence[str],
        attentions: Sequence[Any],
        *,
        batch_index: int = 0,
        segment_start: int | None = None,
        model_name: str = "",
    ) -> AttentionMaps:
        """Build from a model's ``attentions`` (one ``(B, H, L, L)`` per layer, ``None`` for a
        layer that was not asked for), keeping sequence ``batch_index``."""
        ids, layers = [], []
        for i, a in enumerate(attentions):
            if a is None:
                continue
            arr = _to_numpy(a)
            if arr.ndim != 4:
                raise ValueError(
                    f"attentions[{i}] has shape {tuple(arr.shape)}; expected (B, H, L, L)."
                )
            ids.append(i)
            layers.append(arr[batch_index])
        return cls(list(tokens), layers, ids, segment_start, model_name)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (weights rounded to 6 decimals)."""
        return {
            "model_name": self.model_name,
            "tokens": self.tokens,
            "segment_start": self.segment_start,
            "layer_ids": self.layer_ids,
            "layers": [np.round(a, 6).tolist() for a in self.layers],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttentionMaps:
        return cls(
            tokens=data["tokens"],
            layers=[np.asarray(a, dtype=np.float32) for a in data["layers"]],
            layer_ids=list(data.get("layer_ids") or []),
            segment_start=data.get("segment_start"),
            model_name=data.get("model_name", ""),
        )


def _to_numpy(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor, without importing torch here
        return a.detach().float().cpu().numpy()
    return np.asarray(a)
