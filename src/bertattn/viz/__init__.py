"""Visualizers: ``AttentionMaps`` -> text summary, PNG, self-contained HTML, JSON; rollout.

They take data, never a model. ``layer`` arguments are the model's layer ids
(``maps.layer_ids``); an out-of-range layer or head raises ``ValueError`` naming the valid range.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..files import check_output, write_all, write_atomic
from ..maps import AttentionMaps
from ._common import check_layer_head
from .html import render_html, save_html
from .rollout import attention_rollout
from .text import summary

# PNG output needs matplotlib (the optional extra bertattn[png]): .png is imported on the first
# call, so text, HTML and JSON output work without it; without it, the call raises
# bertattn.errors.MissingExtraError naming the pip install.


def render_png(
    maps: AttentionMaps, *, layer: int, head: int, rollout=None, dpi: int = 100
) -> bytes:
    """:func:`bertattn.viz.png.render_png` (imports matplotlib on the first call)."""
    from . import png

    return png.render_png(maps, layer=layer, head=head, rollout=rollout, dpi=dpi)


def save_png(maps: AttentionMaps, path: str | os.PathLike[str], **figure: Any) -> Path:
    """:func:`render_png` written to ``path`` atomically (see :mod:`bertattn.files`);
    ``figure``: its keywords (``layer``, ``head``, ``rollout``, ``dpi``).

    Raises:
        ValueError: as :func:`render_png`; ``UsageError`` (a ``ValueError``) when ``path`` cannot
            be an output (a folder, a missing or unwritable folder).
        OSError: the file cannot be written (the message names the path and the reason).
    """
    check_output(path, what="PNG")
    return write_atomic(path, render_png(maps, **figure))


__all__ = [
    "attention_rollout",
    "check_layer_head",
    "render_all",
    "render_html",
    "render_json",
    "render_png",
    "save_html",
    "save_json",
    "save_png",
    "summary",
]


def render_json(maps: AttentionMaps, *, rollout=None) -> bytes:
    """``maps.to_dict()`` (plus ``"rollout"`` when given) as UTF-8 JSON."""
    data = maps.to_dict()
    if rollout is not None:
        data["rollout"] = [[round(float(x), 6) for x in row] for row in rollout]
    return json.dumps(data, allow_nan=False).encode("utf-8")


def save_json(maps: AttentionMaps, path: str | os.PathLike[str], *, rollout=None) -> Path:
    """:func:`render_json` written to ``path`` atomically."""
    check_output(path, what="JSON file")
    return write_atomic(path, render_json(maps, rollout=rollout))


def render_all(
    maps: AttentionMaps,
    *,
    png: str | os.PathLike[str] | None = None,
    html: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    layer: int | None = None,
    head: int | None = None,
    rollout: bool = False,
    no_steps: str | None = None,
) -> list[Path]:
    """Write the outputs asked for (PNG, HTML page, JSON), all or none; return their paths in
    that order.

    Everything is checked before anything is drawn (``layer``/``head`` — the head the PNG shows
    large, layer 0 / head 0 when not given, and the layer and only head the HTML page opens on,
    its default view when not given — and every output path), every file is rendered, and only
    then are they written together (:func:`bertattn.files.write_all`). ``rollout=True`` adds the
    attention rollout to every output. ``no_steps``: the page's, see :func:`save_html`.
    """
    png_layer = 0 if layer is None else layer
    png_head = 0 if head is None else head
    check_layer_head(maps, png_layer, png_head)
    targets = ((png, "PNG"), (html, "HTML page"), (json_path, "JSON"))
    for path, what in targets:
        if path is not None:
            check_output(path, what=what)
    given = [str(p) for p, _ in targets if p is not None]
    if len(set(given)) != len(given):
        raise ValueError(f"the same file is named for two outputs ({', '.join(given)}).")
    roll = attention_rollout(maps) if rollout else None
    items = []
    if png is not None:
        items.append((png, render_png(maps, layer=png_layer, head=png_head, rollout=roll)))
    if html is not None:
        page = render_html(maps, rollout=roll, layer=layer, head=head, no_steps=no_steps)
        items.append((html, page.encode("utf-8")))
    if json_path is not None:
        items.append((json_path, render_json(maps, rollout=roll)))
    return write_all(items)
