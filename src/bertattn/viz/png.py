"""A static PNG of the attention: every layer x head as thumbnails, one head large, the rollout.

Drawn with matplotlib's Agg canvas on a private ``Figure`` (no pyplot global state, no change to
``rcParams``), so it is safe in threads and servers. The figure size depends only on whether a
rollout panel is drawn: ``figure_size()`` inches times ``dpi`` pixels.

Chinese, Japanese and Korean tokens: matplotlib's default font (DejaVu Sans) has no CJK glyphs.
When the text has CJK characters, a CJK font that matplotlib can find (Debian's
``fonts-noto-cjk``: "Noto Sans CJK SC", ...; see :data:`CJK_FONTS`) is added *after* the usual
font on the texts that may hold tokens, so Latin text keeps its look and CJK characters are drawn
by the fallback. Without such a font the PNG still renders, with boxes for those characters, and
one ``UserWarning`` says so and how to fix it. matplotlib's own per-glyph "missing from font"
warnings are never shown: they are caught around our drawing and summed up in one line.

matplotlib is the optional extra ``bertattn[png]``: without it, importing this module (and so
``bertattn.viz.render_png`` / ``save_png``, which import it when called) raises
:class:`bertattn.errors.MissingExtraError` with the ``pip install`` that fixes it.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
import threading
import warnings
from pathlib import Path

import numpy as np

from ..errors import MissingExtraError

try:  # the optional extra bertattn[png]: importing this module without it names the fix
    import matplotlib as mpl
    from matplotlib import font_manager
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle
except ImportError as exc:
    if exc.name is not None and exc.name.split(".")[0] != "matplotlib":
        raise  # matplotlib is there but broken (one of its own dependencies is missing)
    raise MissingExtraError("PNG output", "matplotlib", "png") from exc

from ..maps import AttentionMaps
from ._common import check_layer_head
from .words import clip, display_width

__all__ = ["render_png", "figure_size", "MAX_LABELS", "CJK_FONTS", "NO_CJK_FONT"]

MAX_LABELS = 60  # token labels per axis of the large heatmap, at most (evenly thinned)
_THUMB_PIXELS = 64  # thumbnails are block-max downsampled to at most this many cells per side
_PANEL_IN = 7.0  # inches: side of a heatmap's cell (the head shown large, the rollout)
_GRID_IN = 7.0  # inches: width of the thumbnail grid beside the large head (no rollout)
_GRID_ROW_IN = 4.5  # inches: height of the thumbnail grid's row under the two heatmaps
_LABEL_PT = (5.0, 12.0)  # token labels' font size: fitted to the rows, within these points
_EM = 0.65  # a display column's width in ems, at most (a CJK character takes two columns)
_LEVEL_PT = 9.0  # horizontal x labels are never made smaller than this to fit


# CJK font families, in order of preference (simplified Chinese first: the readers are Chinese).
# Debian/Ubuntu's fonts-noto-cjk gives the "Noto Sans CJK *" families (matplotlib < 3.10 sees only
# the first face of its .ttc files: "Noto Sans CJK JP", which has the Chinese glyphs too).
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Noto Sans CJK HK",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Microsoft YaHei",
    "SimHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "STHeiti",
    "Droid Sans Fallback",
    "Noto Serif CJK SC",
    "Noto Serif CJK JP",
    "AR PL UMing CN",
    "AR PL UKai CN",
    "SimSun",
    "Arial Unicode MS",
)

NO_CJK_FONT = (
    "the text has CJK characters but no CJK font is installed; they are drawn as boxes in the "
    "PNG: install fonts-noto-cjk (Debian/Ubuntu) or any CJK font matplotlib can find"
)

# Han (with extensions, radicals, compatibility forms), kana, Hangul, Bopomofo, CJK symbols and
# punctuation, and full/half-width forms: the characters DejaVu Sans does not have.
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u2ff0-\u31ff\u3200-\u4dbf\u4e00-\u9fff\ua960-\ua97f"
    "\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003134f]"
)
# matplotlib's per-glyph warning: "Glyph 19968 (...) missing from font(s) DejaVu Sans." (3.7:
# "... missing from current font.").
_GLYPH_WARNING = re.compile(r"Glyph (\d+) .*missing from")


_CATCH_LOCK = threading.Lock()


def _has_cjk(texts) -> bool:
    return any(_CJK.search(t) for t in texts)


@functools.lru_cache(maxsize=1)  # (thread-safe: at worst two first calls both look)
def _cjk_font() -> str | None:
    """The family name of an installed CJK font matplotlib can use (see :data:`CJK_FONTS`), or
    None. Looked up once per process (cached), only when a text has CJK characters.

    matplotlib keeps its font list in a cache file that it does not refresh when fonts are
    installed later (e.g. ``make test`` installing fonts-noto-cjk after matplotlib first ran).
    So when no CJK font is known, the font files the system has and matplotlib's list lacks are
    added to it (``FontManager.addfont``) — once — and the refreshed list is written back to
    matplotlib's cache, so later processes find the font at once.
    """
    found = _pick_cjk(font_manager.fontManager)
    if found is None and _add_new_system_fonts(font_manager.fontManager):
        found = _pick_cjk(font_manager.fontManager)
    return found


def _pick_cjk(fm) -> str | None:
    names = {f.name for f in fm.ttflist}
    for name in CJK_FONTS:
        if name in names:
            return name
    others = sorted(n for n in names if "CJK" in n and "Mono" not in n)
    return others[0] if others else None


def _add_new_system_fonts(fm) -> bool:
    """Add the system's font files that ``fm`` does not know; True when any was added."""
    try:
        known = {os.path.realpath(f.fname) for f in fm.ttflist}
        new = sorted(p for p in font_manager.findSystemFonts() if os.path.realpath(p) not in known)
    except Exception:  # an unreadable font folder, no fc-list: keep what matplotlib has
        return False
    added = False
    for path in new:
        try:
            fm.addfont(path)
            added = True
        except Exception:  # not a font FreeType can read: matplotlib's own scan skips it too
            continue
    if added:
        version = getattr(font_manager.FontManager, "__version__", None)
        if version is not None:
            try:
                cache = Path(mpl.get_cachedir(), f"fontlist-v{version}.json")
                font_manager.json_dump(fm, cache)
            except Exception:  # a read-only cache folder: the lookup just repeats next process
                pass
    return added


def _font_family(cjk: str) -> list[str]:
    """The usual font family (``rcParams``, read only) with ``cjk`` as a fallback after it."""
    family = mpl.rcParams["font.family"]
    family = [family] if isinstance(family, str) else list(family)
    return family + ([cjk] if cjk not in family else [])


def figure_size(*, rollout: bool) -> tuple[float, float]:
    """(width, height) of the PNG in inches; pixels are these times ``dpi``. Without a rollout
    the thumbnails stand beside the large head; with one, the rollout does, and the thumbnails
    go under both (so each heatmap keeps half the width: readable when the image is shown
    scaled down, as in a README)."""
    if rollout:
        return 2 * _PANEL_IN, _PANEL_IN + _GRID_ROW_IN
    return _PANEL_IN + _GRID_IN, _PANEL_IN


def tick_positions(n: int, max_labels: int = MAX_LABELS) -> np.ndarray:
    """Evenly spaced token indices to label: all when ``n <= max_labels``, else every k-th."""
    step = max(1, math.ceil(n / max_labels))
    return np.arange(0, n, step)


def _short(token: str, width: int = 14) -> str:
    """``token`` cut to ``width`` display columns (CJK characters take two), "…" marking a cut."""
    return token if display_width(token) <= width else clip(token, width - 1) + "…"


def _label_layout(ax, labels: list[str], step: int, n: int) -> tuple[float, float]:
    """The token labels' font size (points) and the x labels' rotation (0 or 45 degrees):
    the size fitted to the spacing of the labelled rows, horizontal x labels when the widest
    fits its column at :data:`_LEVEL_PT` or more, else turned 45 degrees (never on their side)."""
    ax.apply_aspect()  # the heatmap's drawn size (aspect equal, colourbar taken)
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    side_pt = min(box.width * fig_w, box.height * fig_h) * 72
    spacing = side_pt * step / n  # points between two labelled tokens
    size = min(max(0.75 * spacing, _LABEL_PT[0]), _LABEL_PT[1])
    level = 0.9 * spacing / (max(display_width(t) for t in labels) * _EM)  # widest fits: pt
    if level >= _LEVEL_PT:  # horizontal, a little smaller if need be, when still readable
        return min(size, level), 0.0
    return size, 45.0


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


def _heatmap(
    fig: Figure, ax, w: np.ndarray, tokens: list[str], title: str, seg: int | None, font: dict
):
    n = len(tokens)
    im = ax.imshow(w, cmap="viridis", norm=_norm(w), interpolation="nearest", aspect="equal")
    ticks = tick_positions(n)
    labels = [_short(tokens[i]) for i in ticks]
    if seg is not None:
        for line in (ax.axhline, ax.axvline):
            line(seg - 0.5, color="white", lw=0.8, ls="--")
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    bar.set_label("attention weight (square-root scale)", fontsize=11)
    size, turn = _label_layout(ax, labels, int(ticks[1] - ticks[0]) if len(ticks) > 1 else 1, n)
    x_align = {"ha": "right", "rotation_mode": "anchor"} if turn else {}
    ax.set_xticks(ticks, labels, rotation=turn, fontsize=size, **x_align, **font)
    ax.set_yticks(ticks, labels, fontsize=size, **font)
    ax.set_xlabel("key (attended to)", fontsize=12)
    ax.set_ylabel("query (attending)", fontsize=12)
    ax.set_title(title, fontsize=14)


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
                ax.set_ylabel(f"L{lid}", fontsize=10, rotation=0, ha="right", va="center")
            if r == 0:
                ax.set_title(f"H{h}", fontsize=10)
            if (r, h) == sel:
                m = t.shape[0]
                ax.add_patch(
                    Rectangle((-0.5, -0.5), m, m, fill=False, ec="red", lw=2.5, clip_on=False)
                )


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
    cjk = _has_cjk([maps.model_name, *maps.tokens])
    cjk_font = _cjk_font() if cjk else None
    # only the texts that hold tokens (tick labels) or the model name (the title) get the
    # fallback font; per text, so nothing global (rcParams) changes
    font = {"fontfamily": _font_family(cjk_font)} if cjk_font else {}
    # matplotlib warns once per missing glyph (and per font it tried): caught here, around our
    # own drawing only, and summed up below in one line. catch_warnings swaps the process's
    # warning state while it runs, so renders in several threads take turns (the lock).
    with _CATCH_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png = _render(_figure(maps, idx, layer, head, rollout, dpi, font))
    missing: set[str] = set()
    for w in caught:
        m = _GLYPH_WARNING.match(str(w.message))
        if m and issubclass(w.category, UserWarning):
            missing.add(chr(int(m.group(1))))
        else:  # anything else matplotlib says is passed on as it was
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    missing_cjk = {c for c in missing if _CJK.match(c)}
    if missing_cjk and cjk_font is None:  # (a font of the user's rcParams may have them)
        warnings.warn(NO_CJK_FONT, UserWarning, stacklevel=2)
        missing -= missing_cjk
    if missing:
        chars = " ".join(sorted(missing)[:10]) + (" ..." if len(missing) > 10 else "")
        warnings.warn(
            f"{len(missing)} character(s) of the text have no glyph in the fonts matplotlib can "
            f"find ({chars}); they are drawn as boxes in the PNG: install a font that has them",
            UserWarning,
            stacklevel=2,
        )
    return png


def _render(fig: Figure) -> bytes:
    """``fig`` as PNG bytes, at its own dpi."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    return buf.getvalue()


def _figure(
    maps: AttentionMaps,
    idx: int,
    layer: int,
    head: int,
    rollout: np.ndarray | None,
    dpi: int,
    font: dict,
) -> Figure:
    """The drawn figure (:func:`figure_size`): the large head and the thumbnails side by side,
    or with a rollout the large head and the rollout over the thumbnails."""
    n = len(maps.tokens)
    fig = Figure(figsize=figure_size(rollout=rollout is not None), dpi=dpi)
    FigureCanvasAgg(fig)
    name = maps.model_name or "attention"
    fig.suptitle(
        f"{name}: {n} tokens, {maps.num_layers} layers x {maps.num_heads} heads",
        fontsize=16,
        **font,
    )
    if rollout is None:
        spec = fig.add_gridspec(1, 2, left=0.09, right=0.98, bottom=0.17, top=0.88, wspace=0.2)
        main, grid, roll = spec[0, 0], spec[0, 1], None
    else:
        spec = fig.add_gridspec(
            2,
            2,
            height_ratios=[_PANEL_IN, _GRID_ROW_IN],
            left=0.09,
            right=0.93,
            bottom=0.03,
            top=0.93,
            wspace=0.35,
            hspace=0.25,
        )
        main, grid, roll = spec[0, 0], spec[1, :], spec[0, 1]
    cells = (
        (main, maps.layers[idx][head], f"layer {layer}, head {head}"),
        (roll, rollout, "attention rollout (all layers, heads averaged)"),
    )
    for cell, w, title in cells:
        if cell is not None:
            ax = fig.add_subplot(cell)
            _heatmap(fig, ax, w, maps.tokens, title, maps.segment_start, font)
    _thumbnails(fig, grid, maps, (idx, head))
    return fig
