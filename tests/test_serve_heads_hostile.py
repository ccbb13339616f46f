"""What a hostile client found in the head routes, each on a real ``bertattn serve`` on
127.0.0.1 (bounded load):

- ``/v1/rerank`` with ``max_tokens_per_doc: 1`` and 2,048 documents: refused 413 naming
  ``max_tokens_per_doc`` as soon as the windows counted pass the queue's limit, before any
  window is built; the queue is empty after, the next request answered 200;
- ``max_tokens_per_doc`` on a RoBERTa reranker (the bge-reranker kind): its own template;
- ``POST /predict`` honours the body's ``truncate``; ``/v1/rerank`` on a ``--no-truncate``
  server refuses an over-long document (400 naming it and ``max_tokens_per_doc``) and scores
  it whole in windows when ``max_tokens_per_doc`` is sent.
"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from serve_server import error_envelope, metrics, running_server
from test_heads_cross_encoder import save_classifier
from test_heads_windows import _family_reranker

from bertattn import CrossEncoder

QUERY = "the attention head"
LONG = " ".join(["token"] * 300)  # longer than the tiny models' 128


@pytest.fixture(scope="module")
def bert_server(cli_subprocess, tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr") / "rr", 1, seed=3)
    args = ("--threads", "1", "--max-batch-tokens", "1024", "--max-queue-tokens", "8192")
    with running_server(cli_subprocess, folder, *args) as s:
        s.folder = folder
        yield s


@pytest.fixture(scope="module")
def roberta_server(cli_subprocess, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = _family_reranker("roberta", tmp_path_factory.mktemp("roberta"))
    with running_server(cli_subprocess, folder, "--threads", "1", "--no-truncate") as s:
        s.folder = folder
        yield s


def test_thousands_of_one_token_windows_are_413_before_they_are_built(bert_server):
    docs = [f"document {i} " + " ".join(["attention and tokens"] * 50) for i in range(2048)]
    body = {"query": QUERY, "documents": docs, "max_tokens_per_doc": 1}
    start = time.monotonic()
    r = httpx.post(bert_server.url + "/v1/rerank", json=body, timeout=120)
    took = time.monotonic() - start
    assert r.status_code == 413, r.text[:500]
    error = error_envelope(r)
    assert error["param"] == "max_tokens_per_doc" and error["code"] == "request_too_large"
    assert "more than 8192 tokens of windows" in error["message"], error
    assert "raise 'max_tokens_per_doc'" in error["message"], error
    assert took < 10, f"the 413 took {took:.1f} s"  # counted early: a few documents' worth
    m = metrics(bert_server)
    assert m["bertattn_queue_tokens"] == 0 and m["bertattn_queue_requests"] == 0
    ok = httpx.post(
        bert_server.url + "/v1/rerank",
        json={"query": QUERY, "documents": ["a token", LONG], "max_tokens_per_doc": 16},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    ranked = CrossEncoder(bert_server.folder, threads=1).rank(
        QUERY, ["a token", LONG], max_tokens_per_doc=16
    )
    assert [d["index"] for d in ok.json()["results"]] == [d["corpus_id"] for d in ranked]


def test_predict_honours_the_bodys_truncate(bert_server):
    url = bert_server.url + "/predict"
    r = httpx.post(url, json={"inputs": LONG, "truncate": False}, timeout=60)
    assert r.status_code == 400, r.text
    error = error_envelope(r)
    assert error["param"] == "inputs[0]" and error["code"] == "input_too_long"
    assert "send 'truncate': true" in error["message"] and "POST /embed" not in error["message"]
    pair = httpx.post(url, json={"inputs": [[QUERY, LONG]], "truncate": False}, timeout=60)
    assert pair.status_code == 400 and error_envelope(pair)["param"] == "inputs[0]", pair.text
    assert httpx.post(url, json={"inputs": LONG}, timeout=60).status_code == 200  # the server's


def test_a_roberta_reranker_scores_windows(roberta_server):
    docs = ["looks at every token in the sentence", " ".join(["hello world, a model"] * 40)]
    r = httpx.post(
        roberta_server.url + "/v1/rerank",
        json={"query": QUERY, "documents": docs, "max_tokens_per_doc": 12},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    ranked = CrossEncoder(roberta_server.folder, threads=1).rank(QUERY, docs, max_tokens_per_doc=12)
    got = {d["index"]: d["relevance_score"] for d in r.json()["results"]}
    np.testing.assert_allclose(
        [got[d["corpus_id"]] for d in ranked], [d["score"] for d in ranked], atol=1e-6
    )


def test_no_truncate_server_refuses_long_documents_and_truncate_true_lets_them_in(roberta_server):
    url = roberta_server.url
    long = " ".join(["hello world, a model"] * 100)
    r = httpx.post(url + "/v1/rerank", json={"query": QUERY, "documents": ["ok", long]}, timeout=60)
    assert r.status_code == 400, r.text
    error = error_envelope(r)
    assert error["param"] == "documents[1]" and error["code"] == "input_too_long"
    assert "send 'max_tokens_per_doc'" in error["message"], error
    whole = httpx.post(
        url + "/v1/rerank",
        json={"query": QUERY, "documents": ["ok", long], "max_tokens_per_doc": 32},
        timeout=60,
    )
    assert whole.status_code == 200, whole.text
    refused = httpx.post(url + "/predict", json={"inputs": [QUERY, long]}, timeout=60)
    assert refused.status_code == 400
    assert "send 'truncate': true" in error_envelope(refused)["message"]
    cut = httpx.post(url + "/predict", json={"inputs": [QUERY, long], "truncate": True}, timeout=60)
    assert cut.status_code == 200, cut.text
    m = metrics(roberta_server)
    assert m["bertattn_queue_tokens"] == 0
