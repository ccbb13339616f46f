"""One self-contained HTML page of the attention: head view, model view, rollout, steps, and
for a multi-vector model the MaxSim view (which document token each query token matched).

The page needs no network: its CSS and JS (``attention.css``, ``attention.js``, ``maxsim.js``,
package data) and the data are inlined. Every label of the page is in ``attention.js`` (the
MaxSim view's in ``maxsim.js``), in English and Chinese; this module writes the numbers and
the article's own code lines (:mod:`bertattn.viz.words`).
Weights are stored compactly:

* quantized: ``round(w * 255)`` as uint8 (w clipped to [0, 1]); the error is at most 1/510;
* pruned: per query row only the ``top_k`` largest weights are kept, as (key index uint16,
  weight uint8) pairs sorted by weight, so a row costs 3 * top_k bytes instead of 4 * L. With
  ``top_k >= L`` nothing is pruned. The page states k and the attention mass dropped
  (mean and max over rows), so a reader knows what is not drawn.

The steps view recomputes one head's row (q·k, /√d_k, softmax, Σ weights·v) in the page from the
q, k, v of the layers in ``maps.qkv``: each such layer is stored as float16 ``(3, H, L, D)``
(q, k, v), little-endian, base64 (float32 where a value is beyond float16's range). Their error
bounds are measured here, when the page is written, against the float32 originals (see
``qkv_error_bounds``): the max abs error of q/k/v, and what it makes of the scores q·k, the
scaled scores, the softmax weights and the context. The page checks its recomputed weights
against the head view's stored ones within 1/510 + the weights' bound.

For 512 tokens, 6 layers x 12 heads and top_k=32 that is 3.5 MB raw, 4.7 MB as base64; the
q/k/v of one MiniLM layer (12 heads x 512 tokens x 32) add 1.2 MB raw, 1.6 MB as base64.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..files import check_output, write_atomic
from ..maps import AttentionMaps
from ._common import check_layer_head, layer_index
from .words import ARTICLE_CODE, LANGS, subword_note

__all__ = ["save_html", "render_html", "DEFAULT_TOP_K", "qkv_error_bounds"]

DEFAULT_TOP_K = 32
_PLACEHOLDER = re.compile(r"\{\{(TITLE|CSS|JS|DATA)\}\}")
_F16_MAX = 65000.0  # beyond this (float16's largest finite is 65504) a layer is stored float32
_U32 = 2.0**-24  # float32 unit roundoff


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


def _round_up(x: float) -> float:
    """``x`` rounded up to 2 significant digits (a stated bound never understates)."""
    if not x > 0:
        return 0.0
    e = math.floor(math.log10(x)) - 1
    return math.ceil(x / 10.0**e * (1 + 1e-9)) * 10.0**e


def _softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def qkv_error_bounds(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, stored: np.ndarray
) -> dict[str, float]:
    """How far the page's recomputation from ``stored`` (the decoded ``(3, H, L, D)`` q, k, v)
    can be from what the model computed from its float32 ``q``, ``k``, ``v`` ``(H, L, D)``;
    measured over all heads and rows, rounded up to 2 significant digits.

    Each bound is the quantization error, measured exactly (float64, stored vs original), plus
    the float32 rounding the model's own computation may carry (``u = 2^-24``,
    ``γ_n = n·u / (1 - n·u)``, any summation order):

    * ``qkv``: max |stored - original|;
    * ``scores`` (q·k): max |q̃·k̃ - q·k| + ``γ_D · max Σ|q||k|``; ``scaled``: that / √D;
    * ``weights``: max |softmax(q̃·k̃/√D) - softmax(q·k/√D)| + ``r``, where
      ``r = 2·γ_D·max Σ|q||k| / √D + (L + 8)·u`` bounds the model's relative error of a
      weight (a score error δ moves a softmax weight by at most 2δ of itself);
    * ``context`` (Σ w·v): max |Σ w̃ ṽ - Σ w v| + ``(r + γ_L) · max Σ w|v|``.

    The weights are not compared with the model's (``AttentionMaps.layers``): the page checks
    its recomputation against those, and that check must be able to fail.
    """
    f64 = np.float64
    d, n = q.shape[-1], q.shape[-2]
    gamma_d, gamma_l = d * _U32 / (1 - d * _U32), n * _U32 / (1 - n * _U32)
    out = dict.fromkeys(("qkv", "scores", "weights", "context"), 0.0)
    out["qkv"] = float(max(np.abs(stored[i] - a).max() for i, a in enumerate((q, k, v))))
    for h in range(q.shape[0]):  # one head at a time: (L, L) float64 arrays, not (H, L, L)
        q0, k0, v0 = q[h].astype(f64), k[h].astype(f64), v[h].astype(f64)
        qs, ks, vs = (stored[i, h].astype(f64) for i in range(3))
        s, s0 = qs @ ks.T, q0 @ k0.T
        round_s = gamma_d * float((np.abs(q0) @ np.abs(k0).T).max())
        rel = 2 * round_s / math.sqrt(d) + (n + 8) * _U32
        w, w0 = _softmax(s / math.sqrt(d)), _softmax(s0 / math.sqrt(d))
        out["scores"] = max(out["scores"], float(np.abs(s - s0).max()) + round_s)
        out["weights"] = max(out["weights"], float(np.abs(w - w0).max()) + rel)
        round_c = (rel + gamma_l) * float((w0 @ np.abs(v0)).max())
        out["context"] = max(out["context"], float(np.abs(w @ vs - w0 @ v0).max()) + round_c)
    out["scaled"] = out["scores"] / math.sqrt(d)
    return {key: _round_up(val) for key, val in out.items()}


def _qkv_data(maps: AttentionMaps) -> dict | None:
    """The page's ``qkv`` entry: the layers in ``maps.qkv`` (in layer order), encoded."""
    ids = [i for i in maps.layer_ids if i in maps.qkv]
    if not ids:
        return None
    blobs, dtypes, errors, d = [], [], [], 0
    for i in ids:
        q, k, v = (maps.qkv[i][name] for name in ("q", "k", "v"))
        arr = np.stack([q, k, v])  # (3, H, L, D) float32
        if not np.isfinite(arr).all():
            raise ValueError(f"qkv[{i}] holds NaN or infinite values; the page cannot show them.")
        dtype = "<f2" if float(np.abs(arr).max()) <= _F16_MAX else "<f4"
        enc = arr.astype(dtype)
        blobs.append(_b64(enc))
        dtypes.append("f16" if dtype == "<f2" else "f32")
        errors.append(qkv_error_bounds(q, k, v, enc.astype(np.float32)))
        d = int(arr.shape[-1])
    return {"layers": ids, "d": d, "dtype": dtypes, "data": blobs, "err": errors}


def _initial(maps: AttentionMaps, layer: int | None, head: int | None) -> dict:
    """The view the page opens on: a layer position and one head, each or both optional."""
    if layer is not None and head is not None:
        return {"layer": check_layer_head(maps, layer, head), "head": head}
    if layer is not None:
        return {"layer": layer_index(maps, layer), "head": None}
    if head is not None:
        check_layer_head(maps, maps.layer_ids[0], head)
    return {"layer": None, "head": head}


def render_html(
    maps: AttentionMaps,
    *,
    rollout: np.ndarray | None = None,
    title: str | None = None,
    top_k: int = DEFAULT_TOP_K,
    layer: int | None = None,
    head: int | None = None,
    maxsim: dict | None = None,
    no_steps: str | None = None,
) -> str:
    """The page as a string (:func:`save_html` says what each keyword does)."""
    n = len(maps.tokens)
    if maxsim is not None:
        _check_maxsim(maxsim)
    if n > 65535:
        raise ValueError(f"{n} tokens: the page stores key indices as uint16 (at most 65535)")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    initial = _initial(maps, layer, head)
    k = min(top_k, n)
    idx_parts, val_parts, dropped = [], [], []
    for a in maps.layers:  # (H, L, L) each, one at a time to bound memory
        i, v, d = sparsify(a, k)
        idx_parts.append(i)
        val_parts.append(v)
        dropped.append(d)
    drop = np.concatenate([d.ravel() for d in dropped])
    data = {
        "title": title,  # None: the page writes its own, in the reader's language
        "model_name": maps.model_name,
        "tokens": maps.tokens,
        "layer_ids": maps.layer_ids,
        "heads": maps.num_heads,
        "segment_start": maps.segment_start,
        "n": n,
        "k": k,
        "dropped_mean": float(drop.mean()),
        "dropped_max": float(drop.max()),
        "idx": _b64(np.stack(idx_parts)),  # (layers, H, L, k)
        "val": _b64(np.stack(val_parts)),
        "rollout": None,
        "qkv": _qkv_data(maps),
        "initial": initial,
        "maxsim": maxsim,
        "article": ARTICLE_CODE,  # the article's own lines of each step, for the steps view
        "no_steps": no_steps,  # why the model has no steps view (None: it has one)
        "subword_note": {lang: subword_note(maps.tokens, lang) for lang in LANGS},
    }
    if rollout is not None:
        rollout = np.asarray(rollout, dtype=np.float32)
        if rollout.shape != (n, n):
            raise ValueError(f"rollout has shape {rollout.shape}; expected ({n}, {n})")
        ri, rv, _ = sparsify(rollout, k)
        data["rollout"] = {"idx": _b64(ri), "val": _b64(rv)}
    if title is None:
        title = f"{maps.model_name}: attention" if maps.model_name else "bertattn attention"
    # JSON inside <script>: escape '<' so no token can close the element
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    parts = {
        "TITLE": html.escape(title),
        "CSS": _asset("attention.css"),
        "JS": _asset("attention.js") + "\n" + _asset("maxsim.js"),
        "DATA": payload,
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("template.html"))


def _check_maxsim(data: dict) -> None:
    """Refuse a MaxSim view whose parts do not fit together (see
    :meth:`bertattn.jobs.attend_maxsim.MaxSimView.to_dict`)."""
    try:
        nq, nd = len(data["query_tokens"]), len(data["document_tokens"])
        rows, matches = data["matrix"], data["matches"]
        float(data["total"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"maxsim must be MaxSimView.to_dict()'s object (query_tokens, document_tokens, "
            f"matrix, matches, total); it lacks or mistypes {exc}."
        ) from None
    if len(rows) != nq or any(len(r) != nd for r in rows):
        raise ValueError(
            f"maxsim's matrix must be ({nq}, {nd}) (query tokens x document tokens), got "
            f"{len(rows)} rows of {sorted({len(r) for r in rows})}."
        )
    for m in matches:
        if not (0 <= m["query_index"] < nq and 0 <= m["document_index"] < nd):
            raise ValueError(
                f"maxsim match {m} points outside {nq} query and {nd} document tokens."
            )


def save_html(maps: AttentionMaps, path: str | os.PathLike[str], **page: Any) -> Path:
    """Write one self-contained HTML page (no network) showing ``maps``; returns the path.

    Args:
        maps: the attention of one text; the layers in ``maps.qkv`` get the steps view
            (``Bert.attention_maps(..., qkv_layers=[...])`` fills it).
        path: the HTML file; written atomically (temp file in the same folder, then rename).
        page: the page's keywords, as :func:`render_html` takes them (another name is a
            ``TypeError``):
            rollout: an ``(L, L)`` matrix (see ``attention_rollout``), offered as an extra layer.
            title: the page title (default: from ``maps.model_name``).
            top_k: keys kept per query row (see the module docstring); ``>= L`` keeps all.
            layer: the model layer id the page opens on (default the first).
            head: the only head selected when the page opens (default all of them).
            maxsim: a multi-vector model's MaxSim of a query against a document
                (:meth:`bertattn.jobs.attend_maxsim.MaxSimView.to_dict`): the page's MaxSim view.
            no_steps: for a model that has no steps view, the step the page could not recompute
                (e.g. "ModernBERT's rotary positions and local windows"): the page then says so
                and points to ``bertattn attend --explain`` instead of offering ``--steps``.

    Raises:
        ValueError: a rollout of the wrong shape, more than 65535 tokens, ``top_k < 1``, a
            ``layer`` or ``head`` out of range, non-finite q/k/v, a ``maxsim`` whose parts do
            not fit together.
        TypeError: ``layer`` or ``head`` not an int.
        UsageError: ``path`` cannot be an output (a folder, a missing or unwritable folder).
        OSError: the file cannot be written (the message names the path and the reason).
    """
    check_output(path, what="HTML page")
    return write_atomic(path, render_html(maps, **page).encode("utf-8"))
