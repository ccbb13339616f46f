"""The head routes of ``bertattn serve`` against the Python API on the same folders:
``/rerank`` (TEI) and ``/v1/rerank`` (Cohere / Jina) equal ``CrossEncoder.predict`` / ``rank``,
``/predict`` equals the text-classification pipeline, ``/embed_sparse`` equals
``SparseEncoder.encode``; a route the model cannot answer is a 400 naming its head; bad bodies
are 4xx naming the field. In-process (the app over ASGI), and one real server process per kind
in the slow tier.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import torch
from serve_server import running_server
from test_heads_cross_encoder import save_classifier
from test_heads_pipelines import sentiment  # noqa: F401  (a fixture: 3 labels)

import bertattn
from bertattn import CrossEncoder, SparseEncoder
from bertattn.serve import create_app

QUERY = "the attention head"
DOCS = [
    "looks at every token in the sentence",
    "hello world",
    "bert model layer and a word",
    " ".join(["token"] * 300),  # longer than the tiny model's 128
]


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr"), 1, seed=3)


def ask(model, calls):  # type: ignore[no-untyped-def]
    """``calls``: [(path, body)] posted to ``create_app(model)``; the responses."""
    app = create_app(model, max_batch_tokens=1024)

    async def go():  # type: ignore[no-untyped-def]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            out = []
            for path, body in calls:
                out.append(await (c.get(path) if body is None else c.post(path, json=body)))
            return out

    try:
        return asyncio.run(go())
    finally:
        app.state.serve.batcher.stop(10)


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_rerank_routes_equal_the_cross_encoder(reranker):
    ce = CrossEncoder(reranker, threads=1)
    pairs = [(QUERY, d) for d in DOCS]
    scores = ce.predict(pairs)
    logits = ce.logits(pairs)[:, 0].numpy()
    ranked = ce.rank(QUERY, DOCS, return_documents=True)
    windows = ce.rank(QUERY, DOCS, max_tokens_per_doc=20)
    r = ask(
        ce,
        [
            ("/rerank", {"query": QUERY, "texts": DOCS, "return_text": True}),
            ("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}),
            ("/v1/rerank", {"model": reranker.name, "query": QUERY, "documents": DOCS}),
            (
                "/v1/rerank",
                {
                    "query": QUERY,
                    "documents": [{"text": d} for d in DOCS],
                    "top_n": 2,
                    "return_documents": True,
                },
            ),  # fmt: skip
            ("/v1/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 20}),
            ("/info", None),
        ],
    )
    assert all(x.status_code == 200 for x in r), [x.text for x in r]
    tei = r[0].json()
    assert [d["index"] for d in tei] == [d["corpus_id"] for d in ranked]
    assert [d["text"] for d in tei] == [d["text"] for d in ranked]
    np.testing.assert_allclose(
        [d["score"] for d in tei], scores[[d["index"] for d in tei]], atol=1e-6
    )
    raw = {d["index"]: d["score"] for d in r[1].json()}
    np.testing.assert_allclose([raw[i] for i in range(len(DOCS))], logits, atol=1e-6)
    v1 = r[2].json()
    assert v1["model"] == reranker.name and [d["index"] for d in v1["results"]] == [
        d["corpus_id"] for d in ranked
    ]
    np.testing.assert_allclose(
        [d["relevance_score"] for d in v1["results"]], [d["score"] for d in ranked], atol=1e-6
    )
    tokens = sum(len(e.ids) for e in ce.bert.tokenizer.encode_batch([QUERY] * 4, DOCS))
    assert v1["usage"] == {"total_tokens": tokens}
    top = r[3].json()["results"]
    assert len(top) == 2 and top[0]["document"] == {"text": ranked[0]["text"]}
    win = r[4].json()["results"]
    assert [d["index"] for d in win] == [d["corpus_id"] for d in windows]
    np.testing.assert_allclose(
        [d["relevance_score"] for d in win], [d["score"] for d in windows], atol=1e-6
    )
    info = r[5].json()
    assert info["model_type"] == "reranker" and "/v1/rerank" in info["routes"]


def test_predict_equals_the_classification_pipeline(sentiment):  # noqa: F811
    pipe = bertattn.pipeline("text-classification", sentiment)
    texts = ["the attention head", "hello world"]
    want = pipe(texts, top_k=None)
    pair_want = pipe({"text": texts[0], "text_pair": texts[1]}, top_k=None)
    r = ask(
        pipe.model,
        [
            ("/predict", {"inputs": texts[0]}),
            ("/predict", {"inputs": texts}),  # two strings: a pair, as TEI reads it
            ("/predict", {"inputs": [texts[0], texts[1], texts[0]]}),
            ("/predict", {"inputs": [texts[0], [texts[0], texts[1]]], "raw_scores": True}),
        ],
    )
    assert all(x.status_code == 200 for x in r), [x.text for x in r]

    def same(got, ref):  # type: ignore[no-untyped-def]
        assert [d["label"] for d in got] == [d["label"] for d in ref]
        np.testing.assert_allclose([d["score"] for d in got], [d["score"] for d in ref], atol=1e-6)

    same(r[0].json(), want[0])
    same(r[1].json(), pair_want)
    for got, ref in zip(r[2].json(), [want[0], want[1], want[0]], strict=True):
        same(got, ref)
    logits = pipe.model.logits([texts[0], (texts[0], texts[1])])
    raw = r[3].json()
    for row, ref in zip(raw, logits, strict=True):
        by = {d["label"]: d["score"] for d in row}
        np.testing.assert_allclose([by[pipe.id2label[i]] for i in range(3)], ref.numpy(), atol=1e-6)


def test_embed_sparse_equals_the_sparse_encoder(splade_dir):
    model = SparseEncoder(splade_dir, threads=1)
    texts = ["the cat sat on the mat", "hello world"]
    dense = model.encode(texts, convert_to_sparse_tensor=False)
    r = ask(model, [("/embed_sparse", {"inputs": texts}), ("/embed_sparse", {"inputs": "hi"})])
    assert [x.status_code for x in r] == [200, 200], r[0].text
    for row, want in zip(r[0].json(), dense, strict=True):
        idx = [d["index"] for d in row]
        assert idx == torch.nonzero(want).flatten().tolist()
        np.testing.assert_allclose([d["value"] for d in row], want[idx].numpy(), atol=1e-6)
    assert len(r[1].json()) == 1


def test_a_route_the_model_cannot_answer_names_its_head(reranker, tiny_checkpoint, splade_dir):
    ce = CrossEncoder(reranker, threads=1)
    r = ask(
        ce,
        [
            ("/v1/embeddings", {"model": reranker.name, "input": "a"}),
            ("/embed", {"inputs": "a"}),
            ("/embed_sparse", {"inputs": "a"}),
        ],
    )
    for x in r:
        assert x.status_code == 400, x.text
        msg = x.json()["error"]["message"]
        assert "a reranker (BertForSequenceClassification, 1 label)" in msg
        assert "POST /rerank" in msg and x.json()["error"]["code"] == "wrong_route_for_model"
    r = ask(
        bertattn.Bert.load(tiny_checkpoint, threads=1),
        [("/rerank", {"query": "a", "texts": ["b"]})],
    )
    assert r[0].status_code == 400 and "sentence-embedding model" in r[0].text
    r = ask(SparseEncoder(splade_dir, threads=1), [("/predict", {"inputs": "a"})])
    assert r[0].status_code == 400 and "SPLADE" in r[0].text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/rerank", {"texts": ["a"]}, "query"),
        ("/rerank", {"query": "q", "texts": "a"}, "texts"),
        ("/rerank", {"query": "q", "texts": []}, "texts"),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, "raw_scores"),
        ("/rerank", {"query": "q", "texts": ["a"], "top_n": 1}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        (
            "/v1/rerank",
            {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1},
            "max_tokens_per_doc",
        ),
        ("/v1/rerank", {"query": "q"}, "documents"),
        ("/predict", {"inputs": [["a", "b", "c"]]}, "inputs[0]"),
        ("/predict", {}, "inputs"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(reranker, path, body, param):
    r = ask(CrossEncoder(reranker, threads=1), [(path, body)])[0]
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_an_unknown_model_name_is_404(reranker):
    r = ask(
        CrossEncoder(reranker),
        [("/v1/rerank", {"model": "other", "query": "q", "documents": ["a"]})],
    )
    assert r[0].status_code == 404 and r[0].json()["error"]["code"] == "model_not_found"


@pytest.mark.slow
def test_bertattn_serve_loads_a_reranker_by_its_architecture(cli_subprocess, reranker):
    ce = CrossEncoder(reranker, threads=1)
    with running_server(cli_subprocess, reranker, "--threads", "1") as server:
        r = httpx.post(
            server.url + "/v1/rerank",
            json={"model": reranker.name, "query": QUERY, "documents": DOCS[:3], "top_n": 3},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        want = ce.rank(QUERY, DOCS[:3])
        assert [d["index"] for d in r.json()["results"]] == [d["corpus_id"] for d in want]
        wrong = httpx.post(
            server.url + "/v1/embeddings", json={"model": reranker.name, "input": "a"}, timeout=30
        )
        assert wrong.status_code == 400 and "reranker" in wrong.text
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
        assert 'bertattn_requests_total{route="rerank",status="200"} 1' in metrics


@pytest.mark.slow
def test_bertattn_serve_loads_a_splade_folder(cli_subprocess, splade_dir):
    model = SparseEncoder(splade_dir, threads=1)
    with running_server(cli_subprocess, splade_dir, "--threads", "1", "--sparse") as server:
        r = httpx.post(server.url + "/embed_sparse", json={"inputs": ["hello world"]}, timeout=30)
        assert r.status_code == 200, r.text
        want = model.encode(["hello world"], convert_to_sparse_tensor=False)[0]
        assert [d["index"] for d in r.json()[0]] == torch.nonzero(want).flatten().tolist()


def test_which_class_serves_a_folder(reranker, splade_dir, tiny_checkpoint, tmp_path):
    from sentence_transformers import SparseEncoder as STSparseEncoder

    from bertattn.heads.auto import resolve_auto

    assert resolve_auto(reranker)[1] == "sequence-classification"
    assert resolve_auto(tiny_checkpoint)[1] == "embedding"
    # a plain BertForMaskedLM may be SPLADE or a plain BERT: an encoder unless --sparse
    assert resolve_auto(splade_dir)[1] == "embedding"
    assert resolve_auto(splade_dir, sparse=True)[1] == "masked-lm"
    STSparseEncoder(str(splade_dir), device="cpu").save(str(tmp_path / "st"))
    assert resolve_auto(tmp_path / "st")[1] == "masked-lm"  # SpladePooling says so itself
    with pytest.raises(ValueError, match="architectures is BertModel.*drop --sparse"):
        resolve_auto(tiny_checkpoint, sparse=True)
