"""``bertattn attend`` on a multi-vector model: TEXT is the query, ``--pair`` the document; which
document token each query token matched (the MaxSim argmax) and its score, in the summary, in
``--json``'s ``maxsim`` object and in the page's MaxSim view (real Chromium), beside the
attention of the encoder on the pair.

The oracle is sentence-transformers' own ``MultiVectorEncoder`` on the same folder: its
``encode_query`` / ``encode_document`` token rows, their products and argmax, its
``similarity``, and the skip-list's punctuation dropped from its tokenizer's tokens, written out
here; none of it comes from bertattn's code."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_multi_vector import build, folder  # noqa: F401  (folder: a fixture)
from test_viz_html import _no_errors_no_network, _open, driver  # noqa: F401  (driver: fixture)

QUERY = "What is the capital of France?"
DOCUMENT = "Paris is the capital of France, and its largest city."
PUNCTUATION = set(string.punctuation)


@dataclass
class Oracle:
    """What sentence-transformers computes for one query and one document."""

    query_tokens: list[str]
    document_tokens: list[str]
    query_kept: list[int]  # token indices that have a row
    document_kept: list[int]
    matches: list[tuple[int, int, float]]  # (query index, document index, score)
    total: float


def oracle(path: Path, query: str, document: str, *, skip_queries: bool = False) -> Oracle:
    """sentence-transformers' rows of ``query`` and ``document`` (its prompts, its skip-list,
    its projection), each row's best document row, and its similarity of the pair. A token is
    kept unless it is punctuation (the skip-list ``build`` saves), for queries only when the
    folder skips them too."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    st = STMultiVectorEncoder(str(path), device="cpu")
    q_rows = st.encode_query(query)
    d_rows = st.encode_document(document)
    tok = st.tokenizer

    def tokens(text: str) -> list[str]:
        return tok.convert_ids_to_tokens(tok(text)["input_ids"])

    q_tokens = tokens(st.prompts["query"] + query)
    d_tokens = tokens(st.prompts["document"] + document)
    q_kept = [i for i, t in enumerate(q_tokens) if not (skip_queries and t in PUNCTUATION)]
    d_kept = [j for j, t in enumerate(d_tokens) if t not in PUNCTUATION]
    assert (len(q_kept), len(d_kept)) == (len(q_rows), len(d_rows))  # the oracle's own check
    sim = (q_rows @ d_rows.T).numpy()
    best = sim.argmax(axis=1)
    matches = [(q_kept[r], d_kept[int(c)], float(sim[r, c])) for r, c in enumerate(best)]
    total = float(st.similarity([q_rows], [d_rows])[0, 0])
    return Oracle(q_tokens, d_tokens, q_kept, d_kept, matches, total)


def assert_matches_oracle(data: dict, want: Oracle) -> None:
    """``--json``'s (or the page's) ``maxsim`` object against sentence-transformers'."""
    assert data["query_tokens"] == want.query_tokens
    assert data["document_tokens"] == want.document_tokens
    skipped_q = [i for i in range(len(want.query_tokens)) if i not in want.query_kept]
    skipped_d = [j for j in range(len(want.document_tokens)) if j not in want.document_kept]
    assert data["query_skipped"] == skipped_q
    assert data["document_skipped"] == skipped_d
    got = [(m["query_index"], m["document_index"]) for m in data["matches"]]
    assert got == [(q, d) for q, d, _ in want.matches]  # the argmax, index for index
    np.testing.assert_allclose(
        [m["score"] for m in data["matches"]], [s for _, _, s in want.matches], atol=1e-4
    )
    assert data["total"] == pytest.approx(want.total, abs=1e-4)
    matrix = data["matrix"]
    for i, row in enumerate(matrix):  # skipped rows and columns hold no score
        for j, x in enumerate(row):
            assert (x is None) == (i in skipped_q or j in skipped_d), (i, j, x)
    for q, d, s in want.matches:
        assert matrix[q][d] == pytest.approx(s, abs=1e-4)
        assert max(x for x in matrix[q] if x is not None) == matrix[q][d]


@pytest.fixture(scope="module")
def both_skipped(minilm_dir, tmp_path_factory) -> Path:
    """A folder whose skip-list applies to queries too, scored by mean-MaxSim."""
    return build(
        minilm_dir,
        tmp_path_factory.mktemp("mve-both") / "mve",
        seed=4,
        skiplist_tasks=["query", "document"],
        prompts={"query": "query: ", "document": "passage: "},
        similarity_fn_name="meanmaxsim",
    )


def _attend(cli, model: Path, tmp_path: Path, query: str = QUERY, *extra: object) -> dict:  # type: ignore[no-untyped-def]
    out = tmp_path / "a.json"
    r = cli("attend", query, "--pair", DOCUMENT, "--model", model, "--json", out, *extra)
    assert r.code == 0, r
    return json.loads(out.read_text(encoding="utf-8"))


def test_matches_equal_sentence_transformers(cli, folder, tmp_path, mkl_products):  # noqa: F811
    want = oracle(folder, QUERY, DOCUMENT)
    data = _attend(cli, folder, tmp_path)
    assert_matches_oracle(data["maxsim"], want)
    assert data["maxsim"]["similarity_fn_name"] == "maxsim"
    assert data["maxsim"]["sum"] == pytest.approx(want.total, abs=1e-4)  # MaxSim: the sum
    assert want.document_kept != list(range(len(want.document_tokens)))  # "," and "." skipped
    # a document token the skip-list drops is never a match
    assert not {d for _, d, _ in want.matches} - set(want.document_kept)
    # the attention beside it: the encoder on the pair, each text with its prompt
    assert data["tokens"] == want.query_tokens + want.document_tokens[1:]
    assert data["segment_start"] == len(want.query_tokens)
    assert data["model_name"].endswith(f"MaxSim {want.total:.3f}")


def test_summary_names_the_score_and_each_match(cli, folder):  # noqa: F811
    want = oracle(folder, QUERY, DOCUMENT)
    r = cli("attend", QUERY, "--pair", DOCUMENT, "--model", folder)
    assert r.code == 0, r
    assert f"MaxSim {want.total:.4f} of the query (TEXT) against the document (--pair)" in r.out
    lines = r.out.splitlines()
    for q, d, s in want.matches:
        line = f"  {q:>4} {want.query_tokens[q]:<16} -> {d:>4} {want.document_tokens[d]} ({s:.4f})"
        assert line in lines, (line, r.out)
    assert "document tokens skipped (skip-list): " in r.out
    assert "one pair, one forward" in r.out  # which input the attention is over


def test_skiplist_on_queries_too(cli, both_skipped, tmp_path):
    query = "capital, of France?"
    want = oracle(both_skipped, query, DOCUMENT, skip_queries=True)
    assert len(want.query_kept) < len(want.query_tokens)  # ":", "," and "?" have no row
    data = _attend(cli, both_skipped, tmp_path, query)
    assert_matches_oracle(data["maxsim"], want)
    assert data["maxsim"]["similarity_fn_name"] == "meanmaxsim"
    n = len(want.query_kept)
    assert data["maxsim"]["total"] == pytest.approx(data["maxsim"]["sum"] / n, abs=1e-5)
    r = cli("attend", query, "--pair", DOCUMENT, "--model", both_skipped)
    assert r.code == 0, r
    assert f"mean-MaxSim {want.total:.4f}" in r.out
    for i in set(range(len(want.query_tokens))) - set(want.query_kept):
        shown = f"  {i:>4} {want.query_tokens[i]:<16}    skipped (skip-list: no row, not matched)"
        assert shown in r.out.splitlines(), r.out


def test_json_to_stdout_has_the_maxsim_object(cli, folder):  # noqa: F811
    r = cli("attend", QUERY, "--pair", DOCUMENT, "--model", folder, "--json", "-")
    assert r.code == 0, r
    assert_matches_oracle(json.loads(r.out)["maxsim"], oracle(folder, QUERY, DOCUMENT))


def test_explain_indexes_the_pair_with_prompts(cli, folder, tmp_path):  # noqa: F811
    """--explain's token is one of the attention's input (the pair, each with its prompt),
    and the MaxSim view is still the query's and the document's."""
    want = oracle(folder, QUERY, DOCUMENT)
    data = _attend(cli, folder, tmp_path, QUERY, "--explain", "0:0:paris")
    paris = data["tokens"].index("paris")
    assert paris == len(want.query_tokens) + want.document_tokens.index("paris") - 1
    assert_matches_oracle(data["maxsim"], want)
    r = cli("attend", QUERY, "--pair", DOCUMENT, "--model", folder, "--explain", "0:0:paris")
    assert r.code == 0, r
    assert f"layer 0, head 0, query {paris} 'paris'" in r.out, r


def test_no_pair_is_refused_and_writes_nothing(cli, folder, tmp_path):  # noqa: F811
    outs = [tmp_path / "a.json", tmp_path / "a.html", tmp_path / "a.png"]
    r = cli(
        "attend", QUERY, "--model", folder, "--json", outs[0], "--html", outs[1], "--png", outs[2]
    )
    assert r.code == 2, r  # as attend's other usage errors
    assert "bertattn attend: error: --model is a multi-vector (MaxSim) model" in r.err, r
    assert "give the query as TEXT and the document as --pair DOC" in r.err, r
    assert "Traceback" not in r.err and r.out == "", r
    assert list(tmp_path.iterdir()) == []


@pytest.mark.browser
def test_the_page_shows_each_match(cli, folder, driver, tmp_path, mkl_products):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    want = oracle(folder, QUERY, DOCUMENT)
    page = tmp_path / "a.html"
    r = cli("attend", QUERY, "--pair", DOCUMENT, "--model", folder, "--html", page)
    assert r.code == 0, r
    _open(driver, page)
    view = driver.find_element(By.ID, "maxsim-view")
    assert view.is_displayed()
    assert driver.find_element(By.ID, "maxsim-total").text == (
        f"MaxSim {want.total:.4f} (similarity of the pair)"
    )
    rows = driver.execute_script("return bertattn.maxsim.rows()")
    assert [r["token"] for r in rows] == want.query_tokens
    by_query = {q: (d, s) for q, d, s in want.matches}
    for row in rows:
        d, s = by_query[row["query_index"]]
        assert (row["document_index"], row["skipped"]) == (d, False)
        assert row["score"] == pytest.approx(s, abs=1e-4)
        assert row["shown"] == f"{row['score']:.3f}"
    docs = driver.find_elements(By.CSS_SELECTOR, "#maxsim-doc .token")
    assert [e.find_element(By.CSS_SELECTOR, ".t").text for e in docs] == want.document_tokens
    classes = [e.get_attribute("class") for e in docs]
    skipped = [j for j, c in enumerate(classes) if "skipped" in c]
    assert skipped == [j for j in range(len(docs)) if j not in want.document_kept]
    # one line per query token; hovering one leaves its line and marks its document token
    assert driver.execute_script("return bertattn.maxsim.drawn") == len(want.matches)
    lines = "return document.getElementById('maxsim-lines').toDataURL()"
    before = driver.execute_script(lines)
    q, d, _ = next(m for m in want.matches if m[0] == 6)  # "capital"
    ActionChains(driver).move_to_element(
        driver.find_elements(By.CSS_SELECTOR, "#maxsim-query .token")[q]
    ).perform()
    assert driver.execute_script("return bertattn.maxsim.drawn") == 1
    assert driver.execute_script(lines) != before
    marked = [int(e.get_attribute("data-i")) for e in docs if "match" in e.get_attribute("class")]
    assert marked == [d]
    # the heatmap: each row's match is the marked cell, a skipped column is grey
    pixel = (
        "var c = document.getElementById('maxsim-heatmap'), g = c.getContext('2d');"
        "return Array.from(g.getImageData(arguments[1], arguments[0], 1, 1).data).slice(0, 3);"
    )
    for q, d, _ in want.matches:
        assert driver.execute_script(pixel, q, d) == [127, 29, 29], (q, d)
    assert driver.execute_script(pixel, 0, skipped[0]) == [228, 231, 236]
    driver.execute_script("bertattn.setLang('zh')")
    assert driver.find_element(By.ID, "maxsim-title").text == "MaxSim 视图"
    _no_errors_no_network(driver)


@pytest.mark.browser
def test_the_page_shows_skipped_query_tokens(cli, both_skipped, driver, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    query = "capital, of France?"
    want = oracle(both_skipped, query, DOCUMENT, skip_queries=True)
    page = tmp_path / "a.html"
    r = cli("attend", query, "--pair", DOCUMENT, "--model", both_skipped, "--html", page)
    assert r.code == 0, r
    _open(driver, page)
    rows = driver.execute_script("return bertattn.maxsim.rows()")
    for row in rows:
        if row["query_index"] in want.query_kept:
            assert not row["skipped"] and row["document_index"] is not None
        else:
            assert row["skipped"] and row["document_index"] is None
            assert row["shown"] == "skipped"
    struck = driver.find_elements(By.CSS_SELECTOR, "#maxsim-query .token.skipped")
    assert len(struck) == len(want.query_tokens) - len(want.query_kept)
    assert driver.find_element(By.ID, "maxsim-total").text.startswith(
        f"mean-MaxSim {want.total:.4f}"
    )
    _no_errors_no_network(driver)


def test_a_plain_model_page_has_no_maxsim_view(cli, tiny_checkpoint, tmp_path):
    out = tmp_path / "a.json"
    r = cli("attend", "hello world", "--model", tiny_checkpoint, "--json", out)
    assert r.code == 0, r
    assert "maxsim" not in json.loads(out.read_text())
