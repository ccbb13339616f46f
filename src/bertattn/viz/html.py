"""One self-contained HTML page of the attention: head view, model view, rollout.

The page needs no network: its CSS and JS (``attention.css``, ``attention.js``, package data)
and the weights are inlined. Weights are stored compactly:

* quantized: ``round(w * 255)`` as uint8 (w clipped to [0, 1]); the error is at most 1/510;
* pruned: per query row only the ``top_k`` largest weights are kept, as (key index uint16,
  weight uint8) pairs sorted by weight, so a row costs 3 * top_k bytes instead of 4 * L. With
  ``top_k >= L`` nothing is pruned. The page states k and the attention mass dropped
  (mean and max over rows), so a reader knows what is not drawn.

For 512 tokens, 6 layers x 12 heads and top_k=32 that is 3.5 MB raw, 4.7 MB as base64.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
from importlib import resources
from pathlib import Path

import numpy as np

from ..files import check_output, write_atomic
from ..maps import AttentionMaps

__all__ = ["save_html", "render_html", "DEFAULT_TOP_K"]

DEFAULT_TOP_K = 32
_PLACEHOLDER = re.compile(r"\{\{(TITLE|SUBTITLE|NOTE|CSS|JS|DATA)\}\}")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def sparsify(mats: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``k`` entries of every row of ``mats`` ``(..., L, L)``, sorted by weight, descending.

    Returns ``idx`` uint16 ``(..., L, k)``, ``val`` uint8 ``(..., L, k)`` (``round(w*255)``)
    and ``dropped`` float64 ``(..., L)``: the weight of each row that was not kept.
    """
    n = mats.shape[-1]
    k = min(k, n)
    w = np.clip(mats.astype(np.float32), 0.0, 1.0)
    if k < n:
        part = np.argpartition(-w, k - 1, axis=-1)[..., :k]  # (..., L, k), unordered
    else:
        part = np.broadcast_to(np.arange(n), w.shape)
    vals = np.take_along_axis(w, part, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    idx = np.take_along_axis(part, order, axis=-1).astype("<u2")
    vals = np.take_along_axis(vals, order, axis=-1)
    dropped = w.sum(axis=-1, dtype=np.float64) - vals.sum(axis=-1, dtype=np.float64)
    return idx, np.rint(vals * 255).astype(np.uint8), np.maximum(dropped, 0.0)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def render_html(
    maps: AttentionMaps,
    *,
    rollout: np.ndarray | None = None,
    title: str | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> str:
    """The page as a string (see ``save_html``)."""
    n = len(maps.tokens)
    if n > 65535:
        raise ValueError(f"{n} tokens: the page stores key indices as uint16 (at most 65535)")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    k = min(top_k, n)
    idx_parts, val_parts, dropped = [], [], []
    for a in maps.layers:  # (H, L, L) each, one at a time to bound memory
        i, v, d = sparsify(a, k)
        idx_parts.append(i)
        val_parts.append(v)
        dropped.append(d)
    data = {
        "tokens": maps.tokens,
        "layer_ids": maps.layer_ids,
        "heads": maps.num_heads,
        "segment_start": maps.segment_start,
        "n": n,
        "k": k,
        "idx": _b64(np.stack(idx_parts)),  # (layers, H, L, k)
        "val": _b64(np.stack(val_parts)),
        "rollout": None,
    }
    if rollout is not None:
        rollout = np.asarray(rollout, dtype=np.float32)
        if rollout.shape != (n, n):
            raise ValueError(f"rollout has shape {rollout.shape}; expected ({n}, {n})")
        ri, rv, _ = sparsify(rollout, k)
        data["rollout"] = {"idx": _b64(ri), "val": _b64(rv)}
    drop = np.concatenate([d.ravel() for d in dropped])
    if k < n:
        note = (
            f"Stored: the top {k} of {n} keys per query (attention mass not drawn: mean "
            f"{drop.mean():.1%}, max {drop.max():.1%} of a row), weights quantized to 1/255 "
            f"(error at most 1/510)."
        )
    else:
        note = f"Stored: all {n} keys per query, weights quantized to 1/255 (error at most 1/510)."
    title = title or (f"{maps.model_name}: attention" if maps.model_name else "bertattn attention")
    subtitle = (
        f"{n} tokens, {maps.num_layers} layers x {maps.num_heads} heads"
        + (f", second segment from token {maps.segment_start}" if maps.segment_start else "")
        + (", with attention rollout" if rollout is not None else "")
    )
    # JSON inside <script>: escape '<' so no token can close the element
    payload = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    parts = {
        "TITLE": html.escape(title),
        "SUBTITLE": html.escape(subtitle),
        "NOTE": html.escape(note),
        "CSS": _asset("attention.css"),
        "JS": _asset("attention.js"),
        "DATA": payload,
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("template.html"))


def save_html(
    maps: AttentionMaps,
    path: str | os.PathLike[str],
    *,
    rollout: np.ndarray | None = None,
    title: str | None = None,
    top_k: int = DEFAULT_TOP_K,
) -> Path:
    """Write one self-contained HTML page (no network) showing ``maps``; returns the path.

    Args:
        maps: the attention of one text.
        path: the HTML file; written atomically (temp file in the same folder, then rename).
        rollout: an ``(L, L)`` matrix (see ``attention_rollout``), offered as an extra layer.
        title: the page title (default: from ``maps.model_name``).
        top_k: keys kept per query row (see the module docstring); ``>= L`` keeps all.

    Raises:
        ValueError: a rollout of the wrong shape, more than 65535 tokens, ``top_k < 1``.
        UsageError: ``path`` cannot be an output (a folder, a missing or unwritable folder).
        OSError: the file cannot be written (the message names the path and the reason).
    """
    check_output(path, what="HTML page")
    page = render_html(maps, rollout=rollout, title=title, top_k=top_k)
    return write_atomic(path, page.encode("utf-8"))
