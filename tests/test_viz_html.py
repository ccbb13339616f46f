"""The self-contained HTML page: its data in Python, and its behaviour in real headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from viz_data import softmax_maps

from bertattn.errors import UsageError
from bertattn.maps import AttentionMaps
from bertattn.viz import attention_rollout, render_html, save_html

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARGS = (
    "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-quic "
    "--no-first-run --disable-background-networking --disable-component-update "
    "--disable-sync --window-size=1500,1000 --lang=en-US"
).split()


def _page_data(page: str) -> dict:
    m = re.search(r'<script id="bertattn-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no data element in the page"
    return json.loads(m.group(1))


# ---- without a browser ------------------------------------------------------------------------


def test_page_is_self_contained():
    maps = softmax_maps(10, 2, 3, seed=1)
    page = render_html(maps, rollout=attention_rollout(maps), title="T <&>")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=[\"'](?!data:)", page)
    assert "<title>T &lt;&amp;&gt;</title>" in page
    assert "{{" not in page  # every placeholder filled


def test_weights_roundtrip_within_quantization_error():
    maps = softmax_maps(40, 2, 3, seed=2)
    data = _page_data(render_html(maps, top_k=8))
    n, k = data["n"], data["k"]
    assert (n, k) == (40, 8)
    idx = np.frombuffer(base64.b64decode(data["idx"]), dtype="<u2").reshape(2, 3, n, k)
    val = np.frombuffer(base64.b64decode(data["val"]), dtype=np.uint8).reshape(2, 3, n, k)
    w = np.stack(maps.layers)  # (layers, H, L, L)
    kept = np.take_along_axis(w, idx.astype(np.int64), axis=-1)
    assert np.abs(kept - val / 255.0).max() <= 1 / 510 + 1e-6
    # the kept ones are the top 8 of each row, sorted
    top = -np.sort(-w, axis=-1)[..., :k]
    np.testing.assert_allclose(kept, top, atol=1e-7)
    assert (np.diff(val.astype(int), axis=-1) <= 0).all()


def test_note_data_says_what_was_pruned():
    """The page's note (written by its script, see test_note_says_what_was_pruned) is made
    from these numbers."""
    maps = softmax_maps(40, 1, 2, seed=3)
    data = _page_data(render_html(maps, top_k=8))
    assert (data["n"], data["k"]) == (40, 8)
    dropped = 1.0 - (-np.sort(-maps.layers[0], axis=-1))[..., :8].sum(axis=-1)
    assert data["dropped_mean"] == pytest.approx(dropped.mean(), abs=1e-6)
    assert data["dropped_max"] == pytest.approx(dropped.max(), abs=1e-6)
    assert _page_data(render_html(maps, top_k=64))["k"] == 40


def test_a_token_cannot_break_out_of_the_data():
    maps = AttentionMaps(["</script><b>x", "ok"], [np.full((1, 2, 2), 0.5, np.float32)])
    page = render_html(maps)
    assert page.count("</script>") == 2  # the data element's and the code's, nothing more
    assert _page_data(page)["tokens"][0] == "</script><b>x"


def test_save_html_is_atomic_and_checks_paths(tmp_path):
    maps = softmax_maps(6, 1, 2)
    out = save_html(maps, tmp_path / "a.html")
    assert list(tmp_path.iterdir()) == [out] and out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(UsageError, match=r"HTML page .*a\.html: the folder .* does not exist"):
        save_html(maps, tmp_path / "missing" / "a.html")
    with pytest.raises(ValueError, match=r"rollout has shape \(2, 2\); expected \(6, 6\)"):
        save_html(maps, tmp_path / "b.html", rollout=np.eye(2))


# ---- in Chromium ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def driver():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: run scripts/ensure-browser.sh (as root); "
            "`make test` does it"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="bertattn-chromium-")
    opts = webdriver.ChromeOptions()
    for a in ARGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_script_timeout(30)
    yield d
    d.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _open(driver, path: Path) -> None:
    """Load the page and wait (up to 30 s) until its script says it is ready."""
    driver.get_log("browser")  # drop earlier messages
    driver.get(path.as_uri())
    deadline = time.monotonic() + 30
    while not driver.execute_script("return !!(window.bertattn && window.bertattn.ready)"):
        assert time.monotonic() < deadline, "page not ready after 30 s"
        time.sleep(0.01)


def _canvas(driver) -> str:
    return driver.execute_script("return document.getElementById('lines').toDataURL()")


def _no_errors_no_network(driver):
    severe = [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]
    assert severe == [], severe
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0


@pytest.fixture(scope="module")
def small_page(tmp_path_factory):
    maps = softmax_maps(12, 3, 4, seed=7, segment_start=6, model_name="syn")
    path = tmp_path_factory.mktemp("html") / "small.html"
    save_html(maps, path, rollout=attention_rollout(maps))
    return path, maps


@pytest.mark.browser
def test_page_loads_cleanly_with_tokens(driver, small_page):
    path, maps = small_page
    _open(driver, path)
    _no_errors_no_network(driver)
    from selenium.webdriver.common.by import By

    left = driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token")
    right = driver.find_elements(By.CSS_SELECTOR, "#tokens-right span.token")
    assert [s.text for s in left] == maps.tokens == [s.text for s in right]
    options = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#layer option")]
    assert options == ["Layer 0", "Layer 1", "Layer 2", "Rollout (all layers)"]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#heads input[type=checkbox]")) == 4
    assert len(driver.find_elements(By.CSS_SELECTOR, "#thumbs canvas")) == 3 * 4 + 1
    assert "seg-start" in left[6].get_attribute("class")


@pytest.mark.browser
def test_hover_isolates_a_token(driver, small_page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _open(driver, small_page[0])
    before = _canvas(driver)
    tok = driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token")[4]
    ActionChains(driver).move_to_element(tok).perform()
    assert driver.execute_script("return bertattn.state().focus") == {"side": "left", "i": 4}
    hovered = _canvas(driver)
    assert hovered != before
    assert "focus" in tok.get_attribute("class")
    key = driver.find_elements(By.CSS_SELECTOR, "#tokens-right span.token")[2]
    ActionChains(driver).move_to_element(key).perform()
    assert _canvas(driver) not in (before, hovered)
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    assert driver.execute_script("return bertattn.state().focus") is None
    assert _canvas(driver) == before
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_layer_selector_heads_and_slider_change_the_drawing(driver, small_page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(driver, small_page[0])
    seen = [_canvas(driver)]
    Select(driver.find_element(By.ID, "layer")).select_by_visible_text("Layer 2")
    assert driver.execute_script("return bertattn.state().layer") == 2
    seen.append(_canvas(driver))
    Select(driver.find_element(By.ID, "layer")).select_by_visible_text("Rollout (all layers)")
    seen.append(_canvas(driver))
    Select(driver.find_element(By.ID, "layer")).select_by_index(0)
    driver.find_elements(By.CSS_SELECTOR, "#heads input")[1].click()
    assert driver.execute_script("return bertattn.state().heads") == [True, False, True, True]
    seen.append(_canvas(driver))
    driver.execute_script(
        "var s = document.getElementById('threshold'); s.value = 0.3;"
        "s.dispatchEvent(new Event('input'));"
    )
    assert driver.find_element(By.ID, "threshold-value").text == "0.30"
    seen.append(_canvas(driver))
    assert len(set(seen)) == len(seen), "some control did not change the drawing"
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_model_view_thumbnail_opens_in_head_view(driver, small_page):
    from selenium.webdriver.common.by import By

    _open(driver, small_page[0])
    before = _canvas(driver)
    thumb = driver.find_element(By.CSS_SELECTOR, '#thumbs canvas[data-layer="1"][data-head="3"]')
    thumb.click()
    assert driver.find_element(By.ID, "layer").get_attribute("value") == "1"
    checked = [b.is_selected() for b in driver.find_elements(By.CSS_SELECTOR, "#heads input")]
    assert checked == [False, False, False, True]
    assert "selected" in thumb.get_attribute("class")
    assert driver.find_element(By.ID, "head-view-caption").text == "layer 1, heads 3"
    assert _canvas(driver) != before
    # the thumbnail is a drawn heatmap, not blank
    pixels = driver.execute_script(
        "var c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "var s = new Set(); for (var i = 0; i < d.length; i += 4) s.add(d[i]); return s.size;",
        thumb,
    )
    assert pixels > 3
    _no_errors_no_network(driver)


@pytest.mark.slow
@pytest.mark.browser
def test_512_tokens_page_budget_and_hover(driver, tmp_path):
    """The size budget and that a 512-token page works; its timings (first paint, redraws)
    are measured by ``python -m benchmarks.viz_html``, not asserted here."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    maps = softmax_maps(512, 6, 12, seed=11, segment_start=256, model_name="synthetic-512")
    path = save_html(maps, tmp_path / "big.html", rollout=attention_rollout(maps))
    size = path.stat().st_size
    assert size <= 20 * 1024 * 1024, f"page is {size / 1e6:.1f} MB, budget 20 MB"
    _open(driver, path)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token")) == 512
    before = _canvas(driver)
    tok = driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token")[5]
    ActionChains(driver).move_to_element(tok).perform()
    assert driver.execute_script("return bertattn.state().focus") == {"side": "left", "i": 5}
    assert _canvas(driver) != before
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    for i, side in [(0, "left"), (511, "right")]:
        driver.execute_script(f"bertattn.hoverToken({i}, '{side}')")
        assert driver.execute_script("return bertattn.state().focus") == {"side": side, "i": i}
    driver.execute_script("bertattn.clearHover(); bertattn.setLayer(3)")
    assert driver.execute_script("return bertattn.state().layer") == 3
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_note_says_what_was_pruned(driver, tmp_path):
    maps = softmax_maps(40, 1, 2, seed=3)
    _open(driver, save_html(maps, tmp_path / "pruned.html", top_k=8))
    note = driver.find_element("id", "note").text
    assert "the top 8 of 40 keys per query" in note and "error at most 1/510" in note
    assert "No q, k, v stored" in note
    _open(driver, save_html(maps, tmp_path / "all.html", top_k=64))
    assert "all 40 keys per query" in driver.find_element("id", "note").text
    _no_errors_no_network(driver)
