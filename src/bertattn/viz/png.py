"""A static PNG of the attention: every layer x head as thumbnails, one head large, the rollout.

Drawn with matplotlib's Agg canvas on a private ``Figure`` (no pyplot global state), so it is safe
in threads and servers. The figure size depends only on whether a rollout panel is drawn:
``figure_size()`` inches times ``dpi`` pixels.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..files import check_output, write_atomic
from ..maps import AttentionMaps
from ._common import check_layer_head

__all__ = ["save_png", "figure_size", "MAX_LABELS"]

MAX_LABELS = 60  # token labels per axis of the large heatmap, at most (evenly thinned)
_THUMB_PIXELS = 64  # thumbnails are block-max downsampled to at most this many cells per side
_MAIN_IN = 11.0  # inches: side of the large heatmap's column, and the figure height
_GRID_IN = 10.0  # inches: width of the thumbnail grid's column


def figure_size(*, rollout: bool) -> tuple[float, float]:
    """(width, height) of the PNG in inches; pixels are these times ``dpi``."""
    width = _MAIN_IN + _GRID_IN + (_MAIN_IN if rollout else 0.0)
    return width, _MAIN_IN


def tick_positions(n: int, max_labels: int = MAX_LABELS) -> np.ndarray:
    """Evenly spaced token indices to label: all when ``n <= max_labels``, else every k-th."""
    step = max(1, math.ceil(n / max_labels))
    return np.arange(0, n, step)


def _short(token: str, width: int = 14) -> str:
    return token if len(token) <= width else token[: width - 1] + "…"


def _downsample(a: np.ndarray, cells: int = _THUMB_PIXELS) -> np.ndarray:
    """Block-max of a square ``(L, L)`` matrix to at most ``cells`` per side (peaks stay)."""
    n = a.shape[0]
    f = math.ceil(n / cells)
    if f <= 1:
        return a
    m = math.ceil(n / f) * f
    padded = np.zeros((m, m), dtype=a.dtype)
    padded[:n, :n] = a
    return padded.reshape(m // f, f, m // f, f).max(axis=(1, 3))


def _norm(w: np.ndarray) -> PowerNorm:
    """Square-root colour scale from 0 to the panel's max: small weights stay visible."""
    return PowerNorm(gamma=0.5, vmin=0.0, vmax=max(float(w.max()), 1e-9))


def _heatmap(fig: Figure, ax, w: np.ndarray, tokens: list[str], title: str, seg: int | None):
    n = len(tokens)
    im = ax.imshow(w, cmap="viridis", norm=_norm(w), interpolation="nearest", aspect="equal")
    ticks = tick_positions(n)
    size = 8 if len(ticks) <= 30 else 6
    labels = [_short(tokens[i]) for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=size)
    ax.set_yticks(ticks, labels, fontsize=size)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title, fontsize=12)
    if seg is not None:
        for line in (ax.axhline, ax.axvline):
            line(seg - 0.5, color="white", lw=0.8, ls="--")
    fig.colorbar(
        im, ax=ax, fraction=0.046, pad=0.02, label="attention weight (square-root colour scale)"
    )


def _thumbnails(fig: Figure, spec, maps: AttentionMaps, sel: tuple[int, int]) -> None:
    rows, cols = maps.num_layers, maps.num_heads
    sub = spec.subgridspec(rows, cols, wspace=0.08, hspace=0.08)
    for r, (lid, a) in enumerate(zip(maps.layer_ids, maps.layers, strict=True)):
        for h in range(cols):
            ax = fig.add_subplot(sub[r, h])
            t = _downsample(a[h])
            ax.imshow(t, cmap="viridis", norm=_norm(t), interpolation="nearest", aspect="equal")
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                ax.set_ylabel(f"L{lid}", fontsize=7, rotation=0, ha="right", va="center")
            if r == 0:
                ax.set_title(f"H{h}", fontsize=7)
            if (r, h) == sel:
                m = t.shape[0]
                ax.add_patch(
                    Rectangle((-0.5, -0.5), m, m, fill=False, ec="red", lw=2.5, clip_on=False)
                )


def save_png(
    maps: AttentionMaps,
    path: str | os.PathLike[str],
    *,
    layer: int,
    head: int,
    rollout: np.ndarray | None = None,
    dpi: int = 100,
) -> Path:
    """:func:`render_png` written to ``path`` atomically (see :mod:`bertattn.files`).

    Raises:
        ValueError: as :func:`render_png`; ``UsageError`` (a ``ValueError``) when ``path`` cannot
            be an output (a folder, a missing or unwritable folder).
        OSError: the file cannot be written (the message names the path and the reason).
    """
    check_output(path, what="PNG")
    return write_atomic(path, render_png(maps, layer=layer, head=head, rollout=rollout, dpi=dpi))


def render_png(
    maps: AttentionMaps,
    *,
    layer: int,
    head: int,
    rollout: np.ndarray | None = None,
    dpi: int = 100,
) -> bytes:
    """A PNG image: thumbnails of every layer x head, ``layer``/``head`` large, and the rollout.

    Args:
        maps: the attention of one text.
        layer: the model's layer id to show large (one of ``maps.layer_ids``).
        head: the head to show large, ``0..H-1``.
        rollout: an ``(L, L)`` matrix (see ``attention_rollout``), drawn as an extra panel.
        dpi: pixels per inch; the image is ``figure_size(rollout=...) * dpi`` pixels.

    Raises:
        ValueError: layer or head out of range, or a rollout of the wrong shape.
    """
    idx = check_layer_head(maps, layer, head)
    n = len(maps.tokens)
    if rollout is not None:
        rollout = np.asarray(rollout, dtype=np.float32)
        if rollout.shape != (n, n):
            raise ValueError(f"rollout has shape {rollout.shape}; expected ({n}, {n})")
    fig = Figure(figsize=figure_size(rollout=rollout is not None), dpi=dpi)
    FigureCanvasAgg(fig)
    widths = [_MAIN_IN, _GRID_IN] + ([_MAIN_IN] if rollout is not None else [])
    spec = fig.add_gridspec(
        1,
        len(widths),
        width_ratios=widths,
        left=0.06,
        right=0.98,
        bottom=0.14,
        top=0.9,
        wspace=0.25,
    )
    name = maps.model_name or "attention"
    fig.suptitle(
        f"{name}: {n} tokens, {maps.num_layers} layers x {maps.num_heads} heads", fontsize=14
    )
    _heatmap(
        fig,
        fig.add_subplot(spec[0, 0]),
        maps.layers[idx][head],
        maps.tokens,
        f"layer {layer}, head {head}",
        maps.segment_start,
    )
    _thumbnails(fig, spec[0, 1], maps, (idx, head))
    if rollout is not None:
        _heatmap(
            fig,
            fig.add_subplot(spec[0, 2]),
            rollout,
            maps.tokens,
            "attention rollout (all layers, heads averaged)",
            maps.segment_start,
        )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
