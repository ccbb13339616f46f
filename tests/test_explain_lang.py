"""``attend --explain`` in Chinese: ``--lang zh|en`` (default from the locale), the page's own
Chinese words, and columns that line up on CJK tokens (padding by display width)."""

from __future__ import annotations

import re
import unicodedata

import pytest
import test_viz_html
from test_viz_html import _open
from viz_data import softmax_maps

from bertattn.viz import save_html

#: CJK characters that are single tokens of the default model's vocabulary, then English
TEXT = "中国人的大学生 went home"
driver = test_viz_html.driver  # one headless Chromium for this module
EN_ONLY = {"LC_ALL": None, "LC_MESSAGES": None, "LANG": "C.UTF-8"}


def width(text: str) -> int:
    """Terminal columns: East Asian wide and fullwidth characters take 2."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _rows(out: str) -> list[str]:
    """The table's rows: one per key, starting with its index."""
    return [line for line in out.splitlines() if re.match(r"\s+\d+  \S", line)]


@pytest.fixture(scope="module")
def zh_run(cli):
    r = cli("attend", TEXT, "--explain", "1:0:2", "--lang", "zh", env=EN_ONLY)
    assert r.code == 0, r
    return r


def test_chinese_labels_are_the_pages_words(zh_run, driver, tmp_path):
    """The terminal's Chinese is the page's: its column words, where-line and article label."""
    _open(driver, save_html(softmax_maps(4, 1, 1), tmp_path / "words.html"))
    zh = driver.execute_script("return bertattn.strings.zh")
    out = zh_run.out
    where = zh["stepsWhere"].format(l=1, h=0, i=2, tok="国")
    assert out.startswith(where), out
    header = out.splitlines()[1].split()
    for word in (zh["colKey"], zh["colWeight"], zh["s5"].split()[-1]):  # 键, 权重, 掩码
        assert word in header, (word, header)
    assert out.count(zh["article"] + "：") == 6  # before each formula line's article lines
    assert "key" not in header and "article" not in out


def test_columns_line_up_on_cjk_tokens(zh_run):
    out = zh_run.out
    header, rows = out.splitlines()[1], _rows(out)
    assert [r.split()[1] for r in rows][1:8] == list("中国人的大学生")
    score_end = width(header[: header.index("q·k") + 3])
    for row in rows:  # where the q·k number ends: the same column in every row
        m = re.match(r"(\s*\d+  \S+\s+-?\d+\.\d{3})", row)
        assert m and width(m.group(1)) == score_end, row
    assert {width(r) for r in rows} == {width(header)}, "rows of different display widths"


def test_language_from_the_locale_and_refusals(cli):
    zh = {"LC_ALL": None, "LC_MESSAGES": None, "LANG": "zh_CN.UTF-8"}
    r = cli("attend", TEXT, "--explain", "1:0:2", env=zh)
    assert r.code == 0 and "查询词元 2「国」" in r.out, r
    r = cli("attend", TEXT, "--explain", "1:0:2", env={**zh, "LC_ALL": "en_US.UTF-8"})
    assert r.code == 0 and r.out.startswith("layer 1, head 0, query 2 '国'"), r  # LC_ALL wins
    r = cli("attend", TEXT, "--explain", "1:0:2", "--lang", "en", env=zh)
    assert r.code == 0 and "article (PyTorch): " in r.out and "文章" not in r.out, r
    r = cli("attend", TEXT, "--lang", "zh", env=EN_ONLY)
    assert r.code == 2 and "--lang zh chooses the language of --explain's steps" in r.err, r
    r = cli("attend", TEXT, "--explain", "1:0:2", "--lang", "fr")
    assert r.code == 2 and "invalid choice: 'fr'" in r.err, r


def test_mask_and_subword_marks_in_words(cli):
    """One text has no padding: the mask line says so; a ## token gets its one-line meaning."""
    r = cli("attend", "the tiredness", "--explain", "1:0:1", "--lang", "en", env=EN_ONLY)
    assert r.code == 0, r
    mask = [line for line in r.out.splitlines() if line.startswith("  mask      = ")]
    assert mask == ["  mask      = nothing to mask: one text (or pair) has no padding, so 0 for "
                    "all 5 keys"], mask  # fmt: skip
    assert r.out.count("“##” marks a piece that continues the word before it") == 1
    assert "tired ##ness are one word, tiredness." in r.out
    r = cli("attend", "the tiredness", "--explain", "1:0:1", "--lang", "zh", env=EN_ONLY)
    assert "没有要遮住的键" in r.out and "tired ##ness 是同一个词 tiredness" in r.out, r


def test_locale_order_and_a_bad_lang():
    from bertattn.viz.words import check_lang, lang_from_env

    assert lang_from_env({"LANG": "zh_TW.UTF-8"}) == "zh"
    assert lang_from_env({"LC_ALL": "", "LC_MESSAGES": "", "LANG": "zh_CN.UTF-8"}) == "zh"
    assert lang_from_env({"LC_MESSAGES": "en_US.UTF-8", "LANG": "zh_CN.UTF-8"}) == "en"
    assert lang_from_env({"LC_ALL": "zh_CN.UTF-8", "LC_MESSAGES": "en_US.UTF-8"}) == "zh"
    assert lang_from_env({}) == "en"
    with pytest.raises(ValueError, match=r"^lang must be 'en' or 'zh', got 'fr'; give lang='en'"):
        check_lang("fr")
