"""Visualizers: ``AttentionMaps`` -> text summary, PNG, self-contained HTML, JSON; rollout.

They take data, never a model. ``layer`` arguments are the model's layer ids
(``maps.layer_ids``); an out-of-range layer or head raises ``ValueError`` naming the valid range.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..maps import AttentionMaps
from ._common import check_layer_head, write_atomic
from .html import render_html, save_html
from .png import save_png
from .rollout import attention_rollout
from .text import summary

__all__ = [
    "attention_rollout",
    "check_layer_head",
    "render_all",
    "render_html",
    "save_html",
    "save_json",
    "save_png",
    "summary",
]


def save_json(maps: AttentionMaps, path: str | os.PathLike[str], *, rollout=None) -> Path:
    """``maps.to_dict()`` (plus ``"rollout"`` when given) as JSON, written atomically."""
    data = maps.to_dict()
    if rollout is not None:
        data["rollout"] = [[round(float(x), 6) for x in row] for row in rollout]
    return write_atomic(path, json.dumps(data).encode("utf-8"), what="JSON file")


def render_all(
    maps: AttentionMaps,
    *,
    png: str | os.PathLike[str] | None = None,
    html: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    layer: int = 0,
    head: int = 0,
    rollout: bool = False,
) -> list[Path]:
    """Write the outputs asked for (PNG, HTML page, JSON); return their paths in that order.

    ``layer``/``head`` pick the head the PNG shows large; they are checked first, whatever
    is asked for, so a bad ``--layer`` fails before anything is written. ``rollout=True`` adds
    the attention rollout to every output.
    """
    check_layer_head(maps, layer, head)
    roll = attention_rollout(maps) if rollout else None
    written = []
    if png is not None:
        written.append(save_png(maps, png, layer=layer, head=head, rollout=roll))
    if html is not None:
        written.append(save_html(maps, html, rollout=roll))
    if json_path is not None:
        written.append(save_json(maps, json_path, rollout=roll))
    return written
