"""The static PNG: size, content, label thinning, atomic writes."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest
from viz_data import softmax_maps

from bertattn.errors import UsageError
from bertattn.viz import attention_rollout, save_png
from bertattn.viz.png import figure_size, tick_positions


def _read(path):
    img = mpimg.imread(path)  # (height, width, channels) floats in [0, 1]
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    return img


def test_png_size_and_not_blank(tmp_path):
    maps = softmax_maps(12, 3, 4, seed=3, segment_start=6, model_name="syn")
    out = save_png(maps, tmp_path / "a.png", layer=1, head=2, dpi=40)
    assert out == tmp_path / "a.png"
    img = _read(out)
    assert figure_size(rollout=False) == (21.0, 11.0)
    assert img.shape[:2] == (11 * 40, 21 * 40)
    assert img[..., :3].var() > 0.01  # a white page has variance 0
    assert list(tmp_path.iterdir()) == [out]  # no temp file left behind


def test_png_with_rollout_is_wider_and_differs(tmp_path):
    maps = softmax_maps(12, 3, 4, seed=3)
    a = _read(save_png(maps, tmp_path / "a.png", layer=0, head=0, dpi=30))
    b = _read(
        save_png(maps, tmp_path / "b.png", layer=0, head=0, dpi=30, rollout=attention_rollout(maps))
    )
    assert b.shape[:2] == (11 * 30, 32 * 30)
    # the rollout panel is not empty: the right third has colour
    assert b[:, 22 * 30 :, :3].var() > 0.01
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
    assert img.shape[:2] == (11 * 20, 21 * 20)
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
