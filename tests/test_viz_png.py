"""The static PNG: size, content, label thinning, atomic writes, CJK tokens (font, one warning)."""

from __future__ import annotations

import copy
import io
import itertools
import warnings

import matplotlib as mpl
import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib import font_manager
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from viz_data import softmax_maps

from bertattn.errors import UsageError
from bertattn.maps import AttentionMaps
from bertattn.viz import attention_rollout, render_png, save_png
from bertattn.viz import png as png_mod
from bertattn.viz.png import NO_CJK_FONT, figure_size, tick_positions

CJK_TOKENS = ["[CLS]", "一", "句", "话", "，", "注意力", "hello", "。", "[SEP]"]


def _read(path):
    img = mpimg.imread(path)  # (height, width, channels) floats in [0, 1]
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    return img


def test_png_size_and_not_blank(tmp_path):
    maps = softmax_maps(12, 3, 4, seed=3, segment_start=6, model_name="syn")
    out = save_png(maps, tmp_path / "a.png", layer=1, head=2, dpi=40)
    assert out == tmp_path / "a.png"
    img = _read(out)
    assert figure_size(rollout=False) == (14.0, 7.0)
    assert img.shape[:2] == (7 * 40, 14 * 40)
    assert img[..., :3].var() > 0.01  # a white page has variance 0
    assert list(tmp_path.iterdir()) == [out]  # no temp file left behind


def test_png_with_rollout_is_taller_and_differs(tmp_path):
    maps = softmax_maps(12, 3, 4, seed=3)
    a = _read(save_png(maps, tmp_path / "a.png", layer=0, head=0, dpi=30))
    b = _read(
        save_png(maps, tmp_path / "b.png", layer=0, head=0, dpi=30, rollout=attention_rollout(maps))
    )
    assert figure_size(rollout=True) == (14.0, 11.5)
    assert b.shape[:2] == (345, 14 * 30)  # the thumbnails go under the two heatmaps
    # the rollout panel is not empty: the top right quarter has colour
    assert b[: 7 * 30, 7 * 30 :, :3].var() > 0.01
    c = _read(save_png(maps, tmp_path / "c.png", layer=2, head=3, dpi=30))
    assert a.shape == c.shape and np.abs(a - c).max() > 0.1  # another head draws differently


def test_label_thinning():
    assert list(tick_positions(12)) == list(range(12))
    t = tick_positions(512)
    assert 30 <= len(t) <= 60
    assert len(set(np.diff(t))) == 1  # evenly spaced
    assert t[0] == 0 and t[-1] >= 512 - (t[1] - t[0])


def test_png_512_tokens_renders(tmp_path):
    maps = softmax_maps(512, 2, 3, seed=5)
    img = _read(save_png(maps, tmp_path / "big.png", layer=1, head=2, dpi=20))
    assert img.shape[:2] == (7 * 20, 14 * 20)
    assert img[..., :3].var() > 0.01


def test_bad_layer_or_head(tmp_path):
    maps = softmax_maps(4, 2, 2)
    with pytest.raises(ValueError, match="^layer 2 is out of range: this model has layers 0..1$"):
        save_png(maps, tmp_path / "a.png", layer=2, head=0)
    with pytest.raises(ValueError, match="^head 5 is out of range: this model has heads 0..1$"):
        save_png(maps, tmp_path / "a.png", layer=0, head=5)
    with pytest.raises(ValueError, match=r"rollout has shape \(3, 3\); expected \(4, 4\)"):
        save_png(maps, tmp_path / "a.png", layer=0, head=0, rollout=np.eye(3))
    assert list(tmp_path.iterdir()) == []


def test_unwritable_paths_raise_clearly(tmp_path):
    """Refused before rendering, as a UsageError (a ValueError) naming the path and the fix."""
    maps = softmax_maps(4, 1, 1)
    with pytest.raises(
        UsageError, match=r"PNG .*nope/a.png: the folder .* does not exist; create it first"
    ):
        save_png(maps, tmp_path / "nope" / "a.png", layer=0, head=0, dpi=10)
    with pytest.raises(UsageError, match="is a folder; give a file name inside it"):
        save_png(maps, tmp_path, layer=0, head=0, dpi=10)
    with pytest.raises(UsageError, match=r"PNG /proc/bertattn-test.png: cannot write in the fold"):
        save_png(maps, "/proc/bertattn-test.png", layer=0, head=0, dpi=10)
    assert list(tmp_path.iterdir()) == []


def test_existing_file_is_replaced_whole(tmp_path):
    maps = softmax_maps(6, 1, 2)
    target = tmp_path / "a.png"
    target.write_bytes(b"old")
    save_png(maps, target, layer=0, head=1, dpi=10)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == [target]


# --- CJK tokens ---------------------------------------------------------------------------------


def _cjk_maps(tokens=CJK_TOKENS, **kw) -> AttentionMaps:
    base = softmax_maps(len(tokens), 2, 2, seed=7, **kw)
    return AttentionMaps(list(tokens), base.layers, model_name="bert-base-chinese")


def _render_all_warnings(maps, **kw) -> tuple[bytes, list[warnings.WarningMessage]]:
    """render_png, and every warning it raised (none filtered away, none deduplicated)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = render_png(maps, layer=0, head=1, dpi=40, **kw)
    return out, list(caught)


def _text_pixels(text: str, family) -> np.ndarray:
    """``text`` drawn alone, large, in ``family``: the grey pixels of a small image."""
    fig = Figure(figsize=(1.2, 0.6), dpi=100)
    canvas = FigureCanvasAgg(fig)
    fig.text(0.1, 0.2, text, fontsize=28, fontfamily=family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DejaVu Sans: matplotlib's missing-glyph warning
        canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].mean(axis=-1)


@pytest.fixture
def cjk_font() -> str:
    found = png_mod._cjk_font()
    if found is None:
        pytest.fail(  # the test set-up installs it: a missing font is a broken set-up
            "no CJK font installed: run `sh scripts/ensure-fonts.sh` (make test does), which "
            "installs fonts-noto-cjk"
        )
    return found


def test_cjk_check_is_cheap_and_right():
    assert png_mod._has_cjk(["hello", "一"])
    for t in ("句", "。", "，", "カ", "ひ", "한", "ㄅ", "注意力", "\U00020000"):
        assert png_mod._has_cjk([t]), t
    for t in ("hello", "[CLS]", "##ing", "café", "привет", "Ωμέγα", "—", "", "12"):
        assert not png_mod._has_cjk([t]), t


def test_cjk_font_is_found_and_glyphs_are_drawn(cjk_font):
    """With the font installed: no warning at all, and the characters are really drawn by it."""
    assert "CJK" in cjk_font or cjk_font in png_mod.CJK_FONTS
    maps = _cjk_maps()
    drawn, caught = _render_all_warnings(maps)
    assert [str(w.message) for w in caught] == []
    family = png_mod._font_family(cjk_font)
    assert family[-1] == cjk_font and family[:-1] == list(mpl.rcParams["font.family"])
    # one CJK character: the chosen font draws it, DejaVu Sans draws a box; they differ
    ink_cjk, ink_box = _text_pixels("句", family), _text_pixels("句", ["DejaVu Sans"])
    assert (ink_cjk < 128).sum() > 30
    assert np.abs(ink_cjk - ink_box).max() > 100
    # and two different characters differ (boxes would all look alike)
    assert np.abs(ink_cjk - _text_pixels("话", family)).max() > 100
    # Latin text keeps its look: the fallback list draws it with the usual font
    assert np.array_equal(_text_pixels("hello", family), _text_pixels("hello", None))


def test_cjk_png_differs_from_the_no_font_png(cjk_font, monkeypatch):
    maps = _cjk_maps()
    with_font, _ = _render_all_warnings(maps)
    monkeypatch.setattr(png_mod, "_cjk_font", lambda: None)
    boxes, _ = _render_all_warnings(maps)
    a = mpimg.imread(io.BytesIO(with_font))[..., :3]
    b = mpimg.imread(io.BytesIO(boxes))[..., :3]
    assert a.shape == b.shape
    # the token labels are left of and below the large heatmap (the left ~third of the image)
    h, w = a.shape[:2]
    assert np.abs(a[:, : w // 3] - b[:, : w // 3]).max() > 0.3
    assert np.array_equal(a[:, w // 2 :], b[:, w // 2 :])  # the thumbnails have no token text


def test_no_cjk_font_warns_once_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(png_mod, "_cjk_font", lambda: None)
    many = [chr(0x4E00 + 37 * i) for i in range(40)]  # 40 different ideographs, one warning
    for maps in (_cjk_maps(), _cjk_maps(many)):
        _, caught = _render_all_warnings(maps)
        assert [str(w.message) for w in caught] == [NO_CJK_FONT]
        assert caught[0].category is UserWarning
        assert "install fonts-noto-cjk" in NO_CJK_FONT and "\n" not in NO_CJK_FONT
    _, caught = _render_all_warnings(_cjk_maps(), rollout=np.eye(len(CJK_TOKENS)))
    assert len(caught) == 1
    # save_png too; the warning points at the caller, not at matplotlib
    with pytest.warns(UserWarning, match="no CJK font is installed.*install fonts-noto-cjk") as rec:
        save_png(_cjk_maps(), tmp_path / "a.png", layer=0, head=0, dpi=20)
    assert len(rec) == 1 and "matplotlib" not in rec[0].filename
    assert mpimg.imread(tmp_path / "a.png").shape[:2] == (7 * 20, 14 * 20)  # still drawn


def test_other_missing_glyphs_are_summed_up_in_one_line(cjk_font):
    """A character no font has (a private-use one): one warning of ours, no raw matplotlib one."""
    _, caught = _render_all_warnings(_cjk_maps(["一", "\ue000", "\ue001", "x"]))
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert msg.startswith("2 character(s) of the text have no glyph") and "Glyph" not in msg


def test_latin_tokens_do_not_look_up_a_font(monkeypatch):
    maps = softmax_maps(9, 2, 2, seed=7, model_name="syn")

    def fail():
        raise AssertionError("the CJK font lookup ran for Latin-only tokens")

    monkeypatch.setattr(png_mod, "_cjk_font", fail)
    out, caught = _render_all_warnings(maps)
    assert caught == []
    # unchanged: the very drawing of before (no font family given to any text)
    assert out == png_mod._render(png_mod._figure(maps, 0, 0, 1, None, 40, {}))


def test_stale_matplotlib_font_list_is_refreshed(cjk_font, monkeypatch, tmp_path):
    """A font installed after matplotlib cached its font list is added to the list, once, and
    the refreshed list is written to matplotlib's cache."""
    stale = copy.copy(font_manager.fontManager)
    stale.ttflist = [f for f in stale.ttflist if f.name != cjk_font and "CJK" not in f.name]
    assert png_mod._pick_cjk(stale) is None
    monkeypatch.setattr(mpl, "get_cachedir", lambda: str(tmp_path))
    assert png_mod._add_new_system_fonts(stale)
    assert png_mod._pick_cjk(stale) == cjk_font
    cached = list(tmp_path.glob("fontlist-v*.json"))
    assert len(cached) == 1 and cjk_font in cached[0].read_text()
    assert not png_mod._add_new_system_fonts(stale)  # nothing new the second time


#: GitHub's README column, in pixels: the hero image is shown scaled to it
README_WIDTH = 880


def _drawn(maps, rollout=None, dpi: int = 100):
    """The figure render_png draws (fonts as it picks them), drawn, and its heatmaps' axes."""
    cjk = png_mod._cjk_font() if png_mod._has_cjk(maps.tokens) else None
    font = {"fontfamily": png_mod._font_family(cjk)} if cjk else {}
    fig = png_mod._figure(maps, 0, 0, 0, rollout, dpi, font)
    fig.canvas.draw()
    maps_axes = [ax for ax in fig.axes if ax.get_xlabel() == "key (attended to)"]
    assert maps_axes
    return fig, maps_axes


@pytest.mark.parametrize(
    "tokens, turned",
    [
        (["[CLS]", "a", "cat", "sat", "on", "it", "[SEP]"], False),
        (CJK_TOKENS, False),  # "注意力" fits its column at 9 points or more: horizontal
        ([f"token{i}" for i in range(40)], True),
        (["[CLS]", "一", "只", "猫", "坐", "在", "垫", "子", "上", "[SEP]"], False),
    ],
)
def test_x_labels_lie_at_most_45_degrees_and_never_overlap(tokens, turned, cjk_font):
    n = len(tokens)
    maps = AttentionMaps(tokens, [np.full((1, n, n), 1.0 / n, dtype=np.float32)])
    _, axes = _drawn(maps)
    for ax in axes:
        labels = ax.get_xticklabels()
        assert {lab.get_rotation() for lab in labels} == {45.0 if turned else 0.0}
        if not turned:  # side by side: each ends before the next begins
            boxes = [lab.get_window_extent() for lab in labels]
            for a, b in itertools.pairwise(boxes):
                assert a.x1 <= b.x0, [lab.get_text() for lab in labels]


def test_readme_hero_labels_are_readable_at_the_readme_width():
    """``make demo``'s PNG (a 25-token pair, with the rollout): token labels at least 8 px
    tall once the image is scaled to the README's width (they were 3 px)."""
    maps = softmax_maps(25, 6, 12, seed=2, segment_start=16)
    fig, axes = _drawn(maps, rollout=attention_rollout(maps))
    scale = README_WIDTH / (fig.get_size_inches()[0] * 100)
    for ax in axes:
        for lab in ax.get_yticklabels() + ax.get_xticklabels():
            assert lab.get_fontsize() * 100 / 72 * scale >= 8.0, lab.get_fontsize()
