"""`bertattn serve` end to end on the tiny checkpoint: a real server process, the official
openai client, rows equal to ``Bert.encode``, TEI routes, token ids, probes and metrics."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import pytest
from serve_server import running_server

pytestmark = pytest.mark.slow  # a server subprocess (torch import + model load)

TEXTS = [
    "hello",
    "the attention head looks at every token",
    "first second",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "ok",
    "the model weighs it on the layer and the text line word",
]
#: 128 tokens per batch: the long inputs below need several batches per request
ARGS = ("--max-batch-tokens", "128", "--max-queue-tokens", "100000", "--threads", "1")


@pytest.fixture(scope="module")
def server(cli_subprocess, tiny_checkpoint):
    with running_server(cli_subprocess, tiny_checkpoint, *ARGS) as s:
        yield s


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    from bertattn import Bert

    return Bert.load(tiny_checkpoint, threads=1)


@pytest.fixture(scope="module")
def name(tiny_checkpoint) -> str:
    return tiny_checkpoint.name


def _rows(body: dict) -> np.ndarray:
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def _tokens(bert, texts) -> int:
    return sum(len(e.ids) for e in bert.tokenizer.encode_batch(texts, max_length=bert.max_length))


def test_openai_client_float_rows_equal_encode(server, bert, name):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30, max_retries=0)
    got = client.embeddings.create(model=name, input=TEXTS, encoding_format="float")
    rows = np.array([d.embedding for d in got.data], dtype=np.float32)
    np.testing.assert_allclose(rows, bert.encode(TEXTS), atol=1e-6, rtol=0)
    assert got.model == name
    assert got.usage.prompt_tokens == got.usage.total_tokens == _tokens(bert, TEXTS)


def test_openai_client_default_base64(server, bert, name):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30, max_retries=0)
    got = client.embeddings.create(model=name, input="the attention head")  # base64 on the wire
    np.testing.assert_allclose(
        np.array(got.data[0].embedding, dtype=np.float32),
        bert.encode("the attention head"),
        atol=1e-6,
        rtol=0,
    )


def test_base64_is_little_endian_float32(server, bert, name):
    r = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": name, "input": TEXTS[:2], "encoding_format": "base64"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
    np.testing.assert_allclose(np.stack(rows), bert.encode(TEXTS[:2]), atol=1e-6, rtol=0)


def test_concurrent_requests_rows_equal_encode(server, bert, name):
    long = " ".join(["the attention head looks at every token"] * 12)  # ~85 tokens
    requests = [[f"{t} {i}" for t in TEXTS] + ([long] if i % 3 == 0 else []) for i in range(24)]

    async def go():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v1/embeddings", json={"model": name, "input": r}) for r in requests)
            )

    answers = asyncio.run(go())
    for texts, r in zip(requests, answers, strict=True):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(_rows(r.json()), bert.encode(texts), atol=1e-6, rtol=0)


def test_request_larger_than_a_batch_is_split_and_ordered(server, bert, name):
    before = _metric(server, "bertattn_batch_texts_count")
    texts = [" ".join(["token"] * n) for n in (100, 3, 60, 1, 90, 40, 2, 75)]  # 128 per batch
    r = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": texts}, timeout=30)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(_rows(r.json()), bert.encode(texts), atol=1e-6, rtol=0)
    assert _metric(server, "bertattn_batch_texts_count") - before >= 4  # > 128 tokens: split


def test_too_long_input_is_truncated_as_encode_does(server, bert, name):
    text = " ".join(["attention"] * 300)  # > 128 tokens
    r = httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": text}, timeout=30)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(_rows(r.json())[0], bert.encode(text), atol=1e-6, rtol=0)
    assert r.json()["usage"]["prompt_tokens"] == bert.max_length


def test_dimensions_truncate(server, bert, name):
    r = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": name, "input": TEXTS, "dimensions": 8},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    rows = _rows(r.json())
    assert rows.shape == (len(TEXTS), 8)
    # this model does not normalize: the first 8 dimensions, as they are
    np.testing.assert_allclose(rows, bert.encode(TEXTS)[:, :8], atol=1e-6, rtol=0)


def test_token_ids_equal_the_text(server, bert, name):
    tok = httpx.post(server.url + "/tokenize", json={"inputs": TEXTS[:3]}, timeout=30)
    assert tok.status_code == 200, tok.text
    ids = [[t["id"] for t in row] for row in tok.json()]
    assert ids[0][0] == bert.tokenizer.encode_batch(["x"])[0].ids[0]  # [CLS] included
    expect = bert.encode(TEXTS[:3])
    for form in (ids, ids[0]):  # list[list[int]] and list[int]
        r = httpx.post(
            server.url + "/v1/embeddings", json={"model": name, "input": form}, timeout=30
        )
        assert r.status_code == 200, r.text
        want = expect if form is ids else expect[:1]
        np.testing.assert_allclose(_rows(r.json()), want, atol=1e-6, rtol=0)
        assert r.json()["usage"]["prompt_tokens"] == sum(len(x) for x in ids[: len(want)])


def test_tokenize_offsets_and_special(server):
    r = httpx.post(
        server.url + "/tokenize",
        json={"inputs": "hello world", "add_special_tokens": False},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    pieces = r.json()[0]
    assert pieces and not any(p["special"] for p in pieces)
    assert "hello world"[pieces[0]["start"] : pieces[0]["stop"]] == pieces[0]["text"]


def test_tei_embed_normalizes_by_default(server, bert):
    expect = bert.encode(TEXTS)
    r = httpx.post(server.url + "/embed", json={"inputs": TEXTS}, timeout=30)
    assert r.status_code == 200, r.text
    rows = np.array(r.json(), dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-6)
    unit = expect / np.linalg.norm(expect, axis=1, keepdims=True)
    np.testing.assert_allclose(rows, unit, atol=1e-6, rtol=0)
    raw = httpx.post(server.url + "/embed", json={"inputs": TEXTS, "normalize": False}, timeout=30)
    np.testing.assert_allclose(np.array(raw.json(), np.float32), expect, atol=1e-6, rtol=0)
    short = httpx.post(server.url + "/embed", json={"inputs": "hello", "dimensions": 4}, timeout=30)
    row = np.array(short.json()[0])
    assert row.shape == (4,) and abs(np.linalg.norm(row) - 1) < 1e-6  # cut, then renormalized


def test_tei_truncate_false_names_the_input(server):
    text = " ".join(["attention"] * 300)
    r = httpx.post(
        server.url + "/embed", json={"inputs": ["ok", text], "truncate": False}, timeout=30
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "inputs[1]" and "302 tokens" in err["message"], err


def test_models_info_and_probes(server, name):
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert models["object"] == "list" and models["data"][0]["id"] == name
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_id"] == name and info["dimensions"] == 32
    assert info["max_input_length"] == 128 and info["max_batch_tokens"] == 128
    for path in ("/live", "/ready", "/health"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200, path


def test_model_not_found(server, name):
    r = httpx.post(
        server.url + "/v1/embeddings", json={"model": "gpt-4", "input": "hi"}, timeout=10
    )
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found" and name in r.json()["error"]["message"]


def _metric(server, prefix: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def test_metrics_after_traffic(server, name):
    httpx.post(server.url + "/v1/embeddings", json={"model": name, "input": "hi"}, timeout=10)
    httpx.post(server.url + "/v1/embeddings", content=b"{", timeout=10)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'bertattn_requests_total{route="embeddings",status="200"}' in text
    assert 'bertattn_requests_total{route="embeddings",status="415"}' in text
    for stage in ("tokenization", "queue", "inference", "serialization"):
        assert f'bertattn_stage_seconds_count{{stage="{stage}"}}' in text, stage
    for name_ in ("bertattn_queue_requests 0", "bertattn_queue_tokens 0", "bertattn_batch_tokens"):
        assert name_ in text
    assert 'bertattn_rejections_total{reason="unsupported_media_type"}' in text
