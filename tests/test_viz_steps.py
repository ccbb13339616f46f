"""The page's steps view: q/k/v embedded as float16 with honest error bounds, the page's own
recomputation of one head's row (q·k, ÷√d_k, softmax, Σ w·v) checked in headless Chromium against
the model's steps (``Bert.attention_steps``), its ✓ / ✗ check, the ways into the view, the
Chinese / English toggle, and the initial layer / head."""

from __future__ import annotations

import base64
import io
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import test_viz_html
from article_code import ARTICLE_LINES
from test_viz_html import _no_errors_no_network, _open, _page_data
from viz_data import softmax_maps

from bertattn.maps import AttentionMaps
from bertattn.viz import attention_rollout, render_all, render_html, save_html
from bertattn.viz.html import qkv_error_bounds

SRC = Path(__file__).resolve().parents[1] / "src" / "bertattn"
TEXT = "The animal didn't cross the street because it was too tired."
LAYER, HEAD = 2, 5
driver = test_viz_html.driver  # its browser fixture: one headless Chromium for this module
STEP_NAMES = ["qkv", "split", "scores", "scaled", "mask", "softmax", "dropout", "context", "merge"]


def qkv_maps(n: int, layers: int, heads: int, d: int, *, qkv_layers, seed=0, scale=1.0):
    """Random q, k, v per layer and the weights they give, softmax(q·kᵀ/√d) per row."""
    rng = np.random.default_rng(seed)
    weights, qkv = [], {}
    for i in range(layers):
        q, k, v = (rng.normal(0.0, scale, (heads, n, d)).astype(np.float32) for _ in range(3))
        s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1) / math.sqrt(d)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        weights.append((e / e.sum(axis=-1, keepdims=True)).astype(np.float32))
        if i in qkv_layers:
            qkv[i] = {"q": q, "k": k, "v": v}
    return AttentionMaps([f"t{i}" for i in range(n)], weights, qkv=qkv, model_name="syn")


def decoded(data: dict, j: int) -> np.ndarray:
    """The page's q, k, v of its j-th stored layer, ``(3, H, L, D)`` float32."""
    q = data["qkv"]
    dtype = "<f2" if q["dtype"][j] == "f16" else "<f4"
    raw = np.frombuffer(base64.b64decode(q["data"][j]), dtype=dtype)
    return raw.astype(np.float32).reshape(3, data["heads"], data["n"], q["d"])


# ---- without a browser ------------------------------------------------------------------------


def test_only_the_qkv_layers_are_embedded_as_float16():
    maps = qkv_maps(20, 3, 2, 8, qkv_layers={1}, seed=1)
    data = _page_data(render_html(maps))
    assert data["qkv"]["layers"] == [1] and data["qkv"]["dtype"] == ["f16"]
    assert data["qkv"]["d"] == 8 and len(data["qkv"]["data"]) == 1
    stored = decoded(data, 0)
    orig = np.stack([maps.qkv[1][n] for n in "qkv"])
    err = np.abs(stored - orig).max()
    assert 0 < err <= data["qkv"]["err"][0]["qkv"]  # stated, and not understated
    assert err <= np.abs(orig).max() * 2.0**-11  # float16: half an ulp
    assert _page_data(render_html(softmax_maps(5, 2, 2)))["qkv"] is None


def test_stated_bounds_hold_for_the_recomputation():
    """What the page computes (float64 from the stored q, k, v) is within the stated bounds of
    what the model computed (float32 from the originals)."""
    maps = qkv_maps(48, 2, 3, 16, qkv_layers={0, 1}, seed=2, scale=2.0)
    data = _page_data(render_html(maps))
    assert data["qkv"]["layers"] == [0, 1]
    for j, layer in enumerate([0, 1]):
        err = data["qkv"]["err"][j]
        q, k, v = (decoded(data, j)[i].astype(np.float64) for i in range(3))
        q0, k0, v0 = (maps.qkv[layer][n] for n in "qkv")
        s = q @ k.transpose(0, 2, 1)
        scores32 = q0 @ k0.transpose(0, 2, 1)  # float32, as a model would
        assert np.abs(s - scores32).max() <= err["scores"]
        assert np.abs(s / 4.0 - scores32 / np.float32(4.0)).max() <= err["scaled"]
        e = np.exp(s / 4.0 - (s / 4.0).max(axis=-1, keepdims=True))
        w = e / e.sum(axis=-1, keepdims=True)
        assert np.abs(w - maps.layers[layer]).max() <= err["weights"]
        assert np.abs(w @ v - maps.layers[layer] @ v0).max() <= err["context"]
        # the check the page makes: within 1/510 of the stored row + the weights' bound
        assert err["weights"] < 0.01


def test_bounds_measure_the_stored_values():
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(0, 1, (2, 10, 8)).astype(np.float32) for _ in range(3))
    exact = qkv_error_bounds(q, k, v, np.stack([q, k, v]))
    assert exact["qkv"] == 0 and exact["weights"] < 1e-4 and exact["scores"] < 1e-4
    off = qkv_error_bounds(q, k, v, np.stack([q + 0.01, k, v]))
    assert 0.01 <= off["qkv"] <= 0.011  # measured, rounded up to 2 digits
    assert off["scores"] > 0.01 and off["weights"] > exact["weights"] * 10


def test_float32_beyond_float16_range_and_non_finite_refused():
    maps = qkv_maps(6, 1, 1, 4, qkv_layers={0})
    maps.qkv[0]["v"][0, 0, 0] = 1e6
    data = _page_data(render_html(maps))
    assert data["qkv"]["dtype"] == ["f32"] and data["qkv"]["err"][0]["qkv"] == 0
    maps.qkv[0]["v"][0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"qkv\[0\] holds NaN or infinite values"):
        render_html(maps)


def test_initial_layer_and_head_are_validated():
    maps = softmax_maps(6, 2, 3, seed=4, layer_ids=[3, 5])
    assert _page_data(render_html(maps))["initial"] == {"layer": None, "head": None}
    assert _page_data(render_html(maps, layer=5, head=2))["initial"] == {"layer": 1, "head": 2}
    assert _page_data(render_html(maps, layer=3))["initial"] == {"layer": 0, "head": None}
    assert _page_data(render_html(maps, head=1))["initial"] == {"layer": None, "head": 1}
    with pytest.raises(ValueError, match=r"layer 4 is out of range: this model has layers 3, 5"):
        render_html(maps, layer=4)
    with pytest.raises(ValueError, match=r"head 3 is out of range: this model has heads 0\.\.2"):
        render_html(maps, layer=3, head=3)
    with pytest.raises(ValueError, match=r"head -1 is out of range"):
        render_html(maps, head=-1)
    with pytest.raises(TypeError, match="layer must be an int"):
        render_html(maps, layer="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="head must be an int"):
        render_html(maps, layer=3, head=True)


def test_render_all_passes_layer_and_head_to_the_page(tmp_path):
    maps = softmax_maps(6, 2, 3, seed=5)
    page, png = tmp_path / "a.html", tmp_path / "a.png"
    render_all(maps, html=page, png=png, layer=1, head=2)
    assert _page_data(page.read_text())["initial"] == {"layer": 1, "head": 2}
    assert png.read_bytes().startswith(b"\x89PNG")
    render_all(maps, html=page)
    assert _page_data(page.read_text())["initial"] == {"layer": None, "head": None}
    with pytest.raises(ValueError, match="head 7 is out of range"):
        render_all(maps, html=tmp_path / "b.html", head=7)
    assert not (tmp_path / "b.html").exists()


# ---- in Chromium, on the real model -----------------------------------------------------------


@pytest.fixture(scope="module")
def bert(minilm_dir):
    from bertattn import Bert

    return Bert.load(minilm_dir)


@pytest.fixture(scope="module")
def real(bert, tmp_path_factory):
    """The default model on TEXT, q/k/v of layer LAYER, with rollout: (maps, page path)."""
    maps = bert.attention_maps(TEXT, qkv_layers=[LAYER])
    assert list(maps.qkv) == [LAYER]
    path = save_html(
        maps, tmp_path_factory.mktemp("steps") / "steps.html", rollout=attention_rollout(maps)
    )
    return maps, path


def _view(driver) -> dict:
    """The steps view's data-* attributes, JSON decoded where they are JSON."""
    attrs = driver.execute_script(
        "var d = document.getElementById('steps-view').dataset, o = {};"
        "for (var k in d) o[k] = d[k]; return o;"
    )
    for key in ("weights", "scores", "scaled", "context", "stored", "err"):
        if key in attrs:
            attrs[key] = json.loads(attrs[key])
    return attrs


def _click_thumb(driver, layer_pos: int, head: int) -> None:
    driver.find_element(
        "css selector", f'#thumbs canvas[data-layer="{layer_pos}"][data-head="{head}"]'
    ).click()


def _click_query(driver, i: int) -> None:
    driver.find_elements("css selector", "#tokens-left span.token")[i].click()


def _variance(png: bytes) -> float:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    return float(img.var())


@pytest.mark.slow
@pytest.mark.browser
def test_clicked_token_steps_match_the_model(driver, bert, real):
    maps, path = real
    _open(driver, path)
    assert driver.find_element("id", "steps-view").get_attribute("data-state") == "closed"
    assert not driver.find_element("id", "steps-view").is_displayed()
    query = maps.tokens.index("it")
    _click_thumb(driver, maps.layer_ids.index(LAYER), HEAD)  # one head selected
    _click_query(driver, query)
    assert driver.find_element("id", "steps-view").is_displayed()
    view = _view(driver)
    assert view["state"] == "ok"
    assert (int(view["layer"]), int(view["head"]), int(view["query"])) == (LAYER, HEAD, query)
    assert driver.execute_script("return bertattn.state().pinned") == {"side": "left", "i": query}

    steps = bert.attention_steps(TEXT, layer=LAYER, head=HEAD, query=query)
    err = view["err"]
    assert err == _page_data(path.read_text())["qkv"]["err"][0]  # what the page states
    page_w = np.array(view["weights"])
    assert np.abs(page_w - steps.weights.numpy()).max() <= err["weights"]
    assert np.abs(np.array(view["scores"]) - steps.scores.numpy()).max() <= err["scores"]
    assert np.abs(np.array(view["scaled"]) - steps.scaled.numpy()).max() <= err["scaled"]
    assert np.abs(np.array(view["context"]) - steps.context.numpy()).max() <= err["context"]
    assert float(steps.bias.abs().max()) == 0.0  # the page says: no key is masked
    assert page_w.sum() == pytest.approx(1.0, abs=1e-9)
    # the check against the head view's stored row
    stored = np.array(view["stored"], dtype=np.float64)  # all keys kept: 16 tokens < top_k 32
    assert np.abs(stored - maps.layer(LAYER)[HEAD, query]).max() <= 1 / 510 + 1e-6
    assert view["check"] == "pass"
    assert float(view["maxDiff"]) == pytest.approx(np.abs(page_w - stored).max(), abs=1e-12)
    assert float(view["bound"]) == pytest.approx(1 / 510 + err["weights"], abs=1e-8)
    check = driver.find_element("id", "steps-check").text
    assert check.startswith("\u2713") and f"{float(view['maxDiff']):.4f}" in check
    # every step, with its code and numbers
    cards = driver.find_elements("css selector", "#steps-body .step")
    assert [c.get_attribute("data-step") for c in cards] == STEP_NAMES
    text = {c.get_attribute("data-step"): c.text for c in cards}
    assert "\u221a32 = 5.657" in text["scaled"]
    assert "bias = 0 for every key (16 of 16)" in text["mask"]
    assert "masked_fill(mask == 0, -1e9)" in text["mask"]
    assert "columns h·d_k..(h+1)·d_k−1 = 160..191" in text["merge"]
    assert "output = self.out_linear(context)" in text["merge"]  # the article's own line
    rows = driver.find_elements("css selector", '[data-step="scores"] table.keys tr[data-j]')
    assert len(rows) == len(maps.tokens)
    shown = [
        float(r.find_elements("css selector", "td.num")[0].text.replace("\u2212", "-"))
        for r in rows
    ]
    np.testing.assert_allclose(shown, steps.scores.numpy(), atol=err["scores"] + 5e-4)
    _no_errors_no_network(driver)


@pytest.mark.slow
@pytest.mark.browser
def test_check_fails_when_qkv_do_not_give_the_weights(driver, real, tmp_path):
    maps, _ = real
    bad = {name: a.copy() for name, a in maps.qkv[LAYER].items()}
    bad["q"][HEAD] *= 1.5  # sharper softmax for this head: not the weights the page shows
    wrong = AttentionMaps(
        maps.tokens, maps.layers, maps.layer_ids, None, maps.model_name, qkv={LAYER: bad}
    )
    _open(driver, save_html(wrong, tmp_path / "wrong.html"))
    driver.execute_script(
        f"bertattn.setLayer({maps.layer_ids.index(LAYER)});"
        f"bertattn.setHeads([{HEAD}]); bertattn.openSteps(3)"
    )
    view = _view(driver)
    assert view["state"] == "ok" and view["check"] == "fail"
    assert float(view["maxDiff"]) > float(view["bound"])
    assert driver.find_element("id", "steps-check").text.startswith("\u2717")
    driver.execute_script("bertattn.setHeads([0])")  # the other heads are untouched
    assert _view(driver)["check"] == "pass"


@pytest.mark.slow
@pytest.mark.browser
def test_ways_into_and_around_the_steps_view(driver, real):
    maps, path = real
    pos = maps.layer_ids.index(LAYER)
    _open(driver, path)
    _click_query(driver, 4)  # all heads selected: a click only pins, as before
    assert driver.execute_script("return bertattn.state().pinned") == {"side": "left", "i": 4}
    assert _view(driver)["state"] == "closed"
    driver.find_element("id", "steps-open").click()  # the Steps button: the pinned token
    assert _view(driver)["state"] == "no-layer"  # layer 0 has no q/k/v
    body = driver.find_element("id", "steps-body").text
    assert "steps are stored for layer 2" in body and "--steps LAYERS" in body
    driver.find_element("css selector", f'#steps-body button[data-layer="{LAYER}"]').click()
    assert driver.execute_script("return bertattn.state().layer") == pos
    assert _view(driver)["state"] == "pick-head"
    driver.find_element("css selector", '#steps-body button[data-head="3"]').click()
    view = _view(driver)
    assert (view["state"], view["head"], view["query"]) == ("ok", "3", "4")
    assert driver.execute_script("return bertattn.state().heads") == [h == 3 for h in range(12)]
    driver.find_element("id", "steps-next").click()
    assert _view(driver)["query"] == "5"
    assert driver.execute_script("return bertattn.state().pinned") == {"side": "left", "i": 5}
    _click_query(driver, 9)  # the view is open: it follows the clicked query token
    assert _view(driver)["query"] == "9"
    driver.execute_script(f"bertattn.setLayer({len(maps.layer_ids)})")  # the rollout
    assert _view(driver)["state"] == "rollout"
    driver.execute_script(f"bertattn.setLayer({pos})")
    assert _view(driver)["state"] == "ok"
    driver.find_element("id", "steps-close").click()
    assert _view(driver)["state"] == "closed"
    assert not driver.find_element("id", "steps-view").is_displayed()
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_page_without_qkv_says_how_to_get_steps(driver, tmp_path):
    _open(driver, save_html(softmax_maps(8, 2, 2, seed=6), tmp_path / "plain.html"))
    driver.execute_script("bertattn.setHeads([1]); bertattn.openSteps(2)")
    view = _view(driver)
    assert view["state"] == "none" and "weights" not in view
    assert "--steps LAYERS" in driver.find_element("id", "steps-body").text
    _no_errors_no_network(driver)


@pytest.mark.slow
@pytest.mark.browser
def test_language_toggle_and_screenshots(driver, real, tmp_path):
    maps, path = real
    _open(driver, path)
    _click_thumb(driver, maps.layer_ids.index(LAYER), HEAD)
    _click_query(driver, maps.tokens.index("because"))
    assert driver.execute_script("return document.documentElement.lang") == "en"

    def labels():
        return driver.execute_script(
            "return Array.from(document.querySelectorAll('[data-i18n]'))"
            ".map(function (e) { return e.textContent; })"
        )

    english = labels()
    assert "Head view" in english and driver.find_element("id", "lang").text == "中文"
    en_png = driver.get_screenshot_as_png()
    (tmp_path / "steps-en.png").write_bytes(en_png)
    caption_en = driver.find_element("id", "head-view-caption").text
    check_en = driver.find_element("id", "steps-check").text

    driver.find_element("id", "lang").click()
    assert driver.execute_script("return document.documentElement.lang") == "zh-CN"
    chinese = labels()
    assert "头视图" in chinese and "计算步骤" in chinese
    unchanged = [a for a, b in zip(english, chinese, strict=True) if a == b]
    assert unchanged == [], f"labels not translated: {unchanged}"
    assert driver.find_element("id", "head-view-caption").text == "第 2 层，头 5" != caption_en
    assert driver.find_element("css selector", "#layer option").text == "第 0 层"
    check_zh = driver.find_element("id", "steps-check").text
    assert check_zh.startswith("\u2713 重算的权重") and check_zh != check_en
    assert "掩码" in driver.find_element("css selector", '[data-step="mask"] h3').text
    assert "存储" in driver.find_element("id", "note").text
    zh_png = driver.get_screenshot_as_png()
    (tmp_path / "steps-zh.png").write_bytes(zh_png)
    for png in (en_png, zh_png):
        assert _variance(png) > 100, "screenshot is blank"
    assert en_png != zh_png
    # both tables have the same strings, and the Chinese ones are translated
    en, zh = driver.execute_script("return [bertattn.strings.en, bertattn.strings.zh]")
    assert sorted(en) == sorted(zh)
    same = {k for k in en if en[k] == zh[k]}
    assert same <= {"colK", "colScore", "colScaled", "thumbRollout", "captionRollout", "s7"}
    driver.find_element("id", "lang").click()
    assert driver.find_element("id", "head-view-caption").text == caption_en
    _no_errors_no_network(driver)


@pytest.mark.slow
@pytest.mark.browser
def test_default_language_follows_the_browser(driver, real):
    _, path = real
    try:
        driver.execute_cdp_cmd(
            "Emulation.setUserAgentOverride",
            {
                "userAgent": driver.execute_script("return navigator.userAgent"),
                "acceptLanguage": "zh-CN",
            },
        )
        _open(driver, path)
        assert driver.execute_script("return navigator.language") == "zh-CN"
        assert driver.execute_script("return bertattn.state().lang") == "zh"
        assert driver.find_element("css selector", "#head-view h2 span").text == "头视图"
    finally:
        driver.execute_cdp_cmd(
            "Emulation.setUserAgentOverride",
            {
                "userAgent": driver.execute_script("return navigator.userAgent"),
                "acceptLanguage": "en-US",
            },
        )
    _open(driver, path)
    assert driver.execute_script("return bertattn.state().lang") == "en"
    driver.get(path.as_uri() + "#lang=zh")
    driver.refresh()
    _open_ready(driver)
    assert driver.execute_script("return bertattn.state().lang") == "zh"


def _open_ready(driver) -> None:
    deadline = time.monotonic() + 30
    while not driver.execute_script("return !!(window.bertattn && window.bertattn.ready)"):
        assert time.monotonic() < deadline, "page not ready after 30 s"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.browser
def test_initial_view_from_layer_and_head(driver, real, tmp_path):
    maps, _ = real
    path = save_html(maps, tmp_path / "initial.html", layer=LAYER, head=HEAD)
    _open(driver, path)
    pos = maps.layer_ids.index(LAYER)
    assert driver.find_element("id", "layer").get_attribute("value") == str(pos)
    checked = [b.is_selected() for b in driver.find_elements("css selector", "#heads input")]
    assert checked == [h == HEAD for h in range(maps.num_heads)]
    assert driver.find_element("id", "head-view-caption").text == f"layer {LAYER}, heads {HEAD}"
    thumb = f'#thumbs canvas[data-layer="{pos}"][data-head="{HEAD}"]'
    assert "selected" in driver.find_element("css selector", thumb).get_attribute("class")
    _click_query(driver, 1)  # one head selected from the start: a click opens the steps
    assert _view(driver)["state"] == "ok"
    # the default is unchanged: first layer, every head
    _open(driver, save_html(maps, tmp_path / "default.html"))
    assert driver.find_element("id", "layer").get_attribute("value") == "0"
    assert all(b.is_selected() for b in driver.find_elements("css selector", "#heads input"))
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_code_lines_are_bertattn_source(driver, tmp_path):
    """The bertattn lines shown beside the article's are in the named file and function."""
    _open(driver, save_html(qkv_maps(4, 1, 1, 8, qkv_layers={0}), tmp_path / "code.html"))
    code = driver.execute_script("return bertattn.code")
    assert sorted(code) == sorted(STEP_NAMES)
    for name, c in code.items():
        source = (SRC / c["file"]).read_text()
        start = source.index(f"def {c['fn']}(")
        body = source[start : source.find("\n    def ", start + 1)]
        for line in c["ours"]:
            assert line in body, f"{name}: {line!r} is not in {c['file']} {c['fn']}"
    # the article's own lines, not paraphrases (e.g. its "context = torch.matmul(attention, v)")
    assert {name: c["article"] for name, c in code.items()} == ARTICLE_LINES
    shown = driver.execute_script(
        "bertattn.openSteps(1); return Array.from(document.querySelectorAll("
        "'#steps-view [data-step] pre.article')).map(function (p) { return p.textContent; })"
    )
    assert shown == ["\n".join(lines) for lines in ARTICLE_LINES.values()]


@pytest.mark.slow
@pytest.mark.browser
def test_512_tokens_with_one_qkv_layer_fits_the_budget(driver, minilm_dir, tmp_path):
    """The default model at 512 tokens with rollout and q/k/v of one layer: <= 20 MB, and the
    steps view works there. Its first paint is measured by ``python -m benchmarks.viz_html
    --steps``, not asserted here."""
    from benchmarks.viz_html import STEPS_LAYER, model_steps_maps

    maps = model_steps_maps()
    assert len(maps.tokens) == 512 and list(maps.qkv) == [STEPS_LAYER]
    path = save_html(maps, tmp_path / "big.html", rollout=attention_rollout(maps))
    size = path.stat().st_size
    assert size <= 20 * 1024 * 1024, f"page is {size / 1e6:.1f} MB, budget 20 MB"
    _open(driver, path)
    steps = driver.execute_script(
        f"bertattn.setLayer({maps.layer_ids.index(STEPS_LAYER)}); bertattn.setHeads([7]);"
        "return bertattn.openSteps(300)"
    )
    assert steps["ok"] and len(steps["weights"]) == 512
    rows = driver.find_elements("css selector", '[data-step="softmax"] table.keys tr[data-j]')
    assert len(rows) == 12  # the heaviest keys by default at this length
    _no_errors_no_network(driver)


def _offered(driver, page: Path, layer_pos: int) -> str:
    """What the page tells a reader about the steps of layer ``layer_pos``, head 0: its note
    and the steps panel's text, in both languages."""
    _open(driver, page)
    told = []
    for lang in ("en", "zh"):
        told.append(
            driver.execute_script(
                f"bertattn.setLang('{lang}'); bertattn.setLayer({layer_pos}); "
                "bertattn.setHeads([0]); bertattn.openSteps(1);"
                "return document.getElementById('note').textContent + '\\n' + "
                "document.getElementById('steps-view').textContent"
            )
        )
    _no_errors_no_network(driver)
    return "\n".join(told)


@pytest.mark.browser
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_page_offers_only_what_attend_accepts(driver, cli, tiny_checkpoint, tmp_path, family):
    """A page written by attend (layer 0's q, k, v stored) opened on layer 1: whatever way to
    the steps it offers (``--steps`` for BERT; ``--explain`` for ModernBERT, whose rotation and
    window the page cannot recompute) is one attend then takes."""
    from test_family_modernbert import save_modernbert

    folder = tiny_checkpoint
    if family == "modernbert":
        folder = tmp_path / "modernbert"
        save_modernbert(folder, tiny_checkpoint)
    text = "the attention head looks"
    r = cli("attend", text, "--model", folder, "--html", tmp_path / "a.html")
    assert r.code == 0, r
    told = _offered(driver, tmp_path / "a.html", 1)
    offers_steps = "--steps" in told
    assert offers_steps == (family == "bert"), told
    assert ("--explain" in told) == (family == "modernbert"), told
    if offers_steps:
        r = cli("attend", text, "--model", folder, "--html", tmp_path / "b.html", "--steps", "1")
        assert r.code == 0, r
        _offered(driver, tmp_path / "b.html", 1)
        assert _view(driver)["state"] == "ok"
    else:
        assert "rotary positions and local windows" in told
        r = cli("attend", text, "--model", folder, "--explain", "1:0:1")
        assert r.code == 0 and "rotate" in r.out, r


def _visible(driver, css: str) -> str:
    return driver.find_element("css selector", css).text  # what a reader sees (not collapsed)


@pytest.mark.browser
def test_check_said_once_in_plain_words_and_mask_says_nothing_to_mask(driver, tmp_path):
    maps = qkv_maps(6, 1, 2, 8, qkv_layers={0}, seed=3)
    maps.tokens = ["[CLS]", "tired", "##ness", "中", "国", "[SEP]"]
    _open(driver, save_html(maps, tmp_path / "once.html"))
    driver.execute_script("bertattn.setHeads([1]); bertattn.openSteps(2)")
    assert _view(driver)["check"] == "pass"
    for lang, plain, nothing in (
        ("en", "The weights recomputed here from q, k and v are the model's", "Nothing to mask"),
        ("zh", "就是模型的权重", "这里没有要遮住的键"),
    ):
        driver.execute_script(f"bertattn.setLang('{lang}')")
        shown = _visible(driver, "#steps-view")
        assert shown.count("\u2713") == 1 and plain in shown, shown
        assert "1/510" not in shown  # the allowance's arithmetic: on demand only
        check = _visible(driver, '[data-step="softmax"] #steps-check')
        assert check.startswith("\u2713 ") and plain in check
        assert _visible(driver, '[data-step="mask"] p.desc').startswith(nothing)
        note = _visible(driver, "#subword-note")  # the ## of the tokens, in one line
        assert "##" in note and "tired ##ness" in note and "tiredness" in note
    driver.find_element("css selector", "#steps-view details.bounds summary").click()
    assert "1/510" in _visible(driver, "#steps-view details.bounds")
    _open(driver, save_html(qkv_maps(4, 1, 1, 8, qkv_layers={0}), tmp_path / "plain.html"))
    assert not driver.find_element("id", "subword-note").is_displayed()  # no mark: no line
    _no_errors_no_network(driver)
