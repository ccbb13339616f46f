"""The HTML page at 512 tokens in headless Chromium: file size, wall time from ``get`` to ready,
first paint, data decode, hover and layer-switch redraws, and (pages with q/k/v) opening the
steps view. Numbers only, nothing asserted (the tests check the page's behaviour and its 20 MB
size budget, not its speed).

    python -m benchmarks.viz_html [--json FILE] [--model] [--steps]

Maps: synthetic softmax rows, 512 tokens x 6 layers x 12 heads with rollout (what
``tests/test_viz_html.py`` renders); ``--model`` adds the default model (MiniLM) on a real
512-token text pair; ``--steps`` adds that pair with rollout and the q/k/v of one layer
(``STEPS_LAYER``) for the steps view (the budget case: <= 20 MB, first paint <= 2 s). Needs
/usr/bin/chromium + /usr/bin/chromedriver (``scripts/ensure-browser.sh``) and selenium (a test
dependency).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bertattn.maps import AttentionMaps
from bertattn.viz import attention_rollout, save_html

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARGS = (
    "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-quic "
    "--no-first-run --disable-background-networking --disable-component-update "
    "--disable-sync --window-size=1500,1000"
).split()


def synthetic_maps(n: int = 512, layers: int = 6, heads: int = 12, seed: int = 11):
    """Random softmax rows, logits ~ N(0, 3) (tests/viz_data.py's ``softmax_maps``)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        x = rng.normal(0.0, 3.0, (heads, n, n))
        x = np.exp(x - x.max(axis=-1, keepdims=True))
        out.append((x / x.sum(axis=-1, keepdims=True)).astype(np.float32))
    tokens = [f"tok{i}" for i in range(n)]
    return AttentionMaps(tokens, out, segment_start=n // 2, model_name=f"synthetic-{n}")


STEPS_LAYER = 2


def model_maps(qkv_layers: tuple[int, ...] = ()) -> AttentionMaps:
    """The default model on a text pair long enough to fill its 512 positions (with the q/k/v
    of ``qkv_layers`` for the steps view)."""
    from bertattn import Bert

    bert = Bert.load()
    bert.max_length = bert.model.config.max_position_embeddings  # 512, not the encoder's 256
    text = " ".join(["The animal didn't cross the street because it was too tired."] * 30)
    pair = " ".join(["It stayed on the sidewalk and slept."] * 30)
    with warnings.catch_warnings():  # the pair is longer than 512 tokens on purpose
        warnings.simplefilter("ignore")
        return bert.attention_maps(text, pair, qkv_layers=list(qkv_layers))


def model_steps_maps() -> AttentionMaps:
    return model_maps((STEPS_LAYER,))


def _driver(profile: str):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ARGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_script_timeout(30)
    return d


def measure_page(driver, path: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    size = path.stat().st_size
    t = time.perf_counter()
    driver.get(path.as_uri())
    while not driver.execute_script("return !!(window.bertattn && window.bertattn.ready)"):
        if time.perf_counter() - t > 60:
            raise RuntimeError(f"{path}: page not ready after 60 s")
        time.sleep(0.01)
    wall = time.perf_counter() - t
    first_paint, decode = driver.execute_script("return [bertattn.firstPaintMs, bertattn.decodeMs]")
    n = len(driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token"))
    tok = driver.find_elements(By.CSS_SELECTOR, "#tokens-left span.token")[5]
    ActionChains(driver).move_to_element(tok).perform()
    mouse_ms = driver.execute_script("return bertattn.lastDrawMs")
    hovers = [
        driver.execute_script(f"return bertattn.hoverToken({i}, '{side}')")
        for i in (0, n // 5, (3 * n) // 5, n - 1)
        for side in ("left", "right")
    ]
    layer_ms = driver.execute_script("bertattn.clearHover(); return bertattn.setLayer(3)")
    steps = {}
    pos = driver.execute_script(  # the first layer with q/k/v, or -1
        "var d = JSON.parse(document.getElementById('bertattn-data').textContent);"
        "return d.qkv ? d.layer_ids.indexOf(d.qkv.layers[0]) : -1"
    )
    if pos >= 0:  # the steps view on that layer, one head, a middle token
        first_ms, ok, all_ms = driver.execute_script(
            f"bertattn.setLayer({pos}); bertattn.setHeads([0]);"
            f"var s = bertattn.openSteps({n // 2}); var first = bertattn.lastStepsMs;"
            "var sel = document.getElementById('steps-keys'); sel.value = 'all';"
            "sel.dispatchEvent(new Event('change'));"
            "return [first, s.ok, bertattn.lastStepsMs];"
        )
        steps = {
            "steps_open_ms": round(first_ms, 1),
            "steps_all_keys_ms": round(all_ms, 1),
            "steps_check_ok": bool(ok),
        }
    return {
        "tokens": n,
        "file_bytes": size,
        "file_mb": round(size / 1e6, 2),
        "wall_get_to_ready_s": round(wall, 3),
        "first_paint_ms": round(first_paint, 1),
        "decode_ms": round(decode, 1),
        "hover_mouse_redraw_ms": round(mouse_ms, 1),
        "hover_redraw_ms_max": round(max(hovers), 1),
        "hover_redraw_ms_mean": round(sum(hovers) / len(hovers), 1),
        "layer_switch_redraw_ms": round(layer_ms, 1),
        **steps,
    }


def run_viz_bench(
    with_model: bool = False, with_steps: bool = False
) -> dict[str, dict[str, float]]:
    cases = {"synthetic 512 x 6 x 12": synthetic_maps}
    if with_model:
        cases["MiniLM, 512-token pair"] = model_maps
    if with_steps:
        cases[f"MiniLM, 512-token pair, q/k/v of layer {STEPS_LAYER}"] = model_steps_maps
    work = Path(tempfile.mkdtemp(prefix="bertattn-viz-bench-"))
    driver = _driver(str(work / "profile"))
    try:
        results = {}
        for name, make in cases.items():
            maps = make()
            page = save_html(maps, work / "page.html", rollout=attention_rollout(maps))
            results[name] = measure_page(driver, page)
        return results
    finally:
        driver.quit()
        shutil.rmtree(work, ignore_errors=True)


def format_viz_table(results: dict[str, dict[str, float]]) -> str:
    lines = ["HTML page in headless Chromium (one run each)"]
    for name, r in results.items():
        lines.append(
            f"  {name}: {r['file_mb']} MB, ready {r['wall_get_to_ready_s']} s, first paint "
            f"{r['first_paint_ms']} ms, decode {r['decode_ms']} ms, hover redraw "
            f"{r['hover_redraw_ms_mean']} ms mean / {r['hover_redraw_ms_max']} ms max, layer "
            f"switch {r['layer_switch_redraw_ms']} ms"
            + (
                f", steps view {r['steps_open_ms']} ms (all keys {r['steps_all_keys_ms']} ms, "
                f"check {'ok' if r['steps_check_ok'] else 'FAILED'})"
                if "steps_open_ms" in r
                else ""
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    p.add_argument("--model", action="store_true", help="add the default model's 512-token page")
    p.add_argument(
        "--steps",
        action="store_true",
        help=f"add the default model's 512-token page with the q/k/v of layer {STEPS_LAYER}",
    )
    args = p.parse_args(argv)
    results = run_viz_bench(with_model=args.model, with_steps=args.steps)
    print(format_viz_table(results))
    print(json.dumps(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
