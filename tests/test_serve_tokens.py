"""The token-vector routes of a real ``bertattn serve`` process (127.0.0.1, a free port) against
their Python twins on the same texts: ``/embed_all`` = ``Bert.encode(output_value=
"token_embeddings")``, ``/embed_late_chunks`` = ``Bert.encode_late_chunks`` (a text longer
than the model too), ``/embed_multi_vector`` = ``MultiVectorEncoder.encode_query`` /
``encode_document``, ``/rerank`` and ``/v1/rerank`` on a multi-vector model = its MaxSim
``similarity``, ``/embed_m3`` = ``M3Encoder.encode``; ``/decode`` = transformers' tokenizer
``decode``. Bad bodies (wrong types, answers larger than ``--max-body-size``, unknown model, a
route the model's kind cannot answer) get one envelope naming the field; the queue's counters
are back to zero afterwards."""

from __future__ import annotations

import base64
import shutil

import httpx
import numpy as np
import pytest
import torch
from serve_server import metrics, running_server

import bertattn
from bertattn import M3Encoder, MultiVectorEncoder

TEXTS = ["the attention head looks at every token", "hello world", "a model, and a layer."]
LONG = " ".join(f"word{i % 17} is here." for i in range(120))  # > 128 tokens (tiny model)
SPANS_LONG = [[0, 200], [200, 900], [900, len(LONG)]]
DOC = "Berlin is the capital of Germany. It has about 3.7 million people. It has museums."
SPANS = [[0, 33], [34, 66], [67, len(DOC)]]
MEAN = {"pooling": "mean"}


def post(server, path: str, body: dict) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(server.url + path, json=body, timeout=60)


def refused(r: httpx.Response, status: int, param: str | None, *words: str) -> None:
    """One envelope: the status, ``param`` naming the field, the message holding ``words``."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err["message"]


def drained(server) -> None:  # type: ignore[no-untyped-def]
    m = metrics(server)
    assert m["bertattn_queue_tokens"] == 0 and m["bertattn_queue_requests"] == 0


def matrix(value: str, width: int, dtype: str = "<f4") -> np.ndarray:
    return np.frombuffer(base64.b64decode(value), dtype=dtype).reshape(-1, width)


# ---------------------------------------------------------------------- an embedding model
@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_embedding_model_token_routes(cli_subprocess, tiny_checkpoint):
    import transformers

    bert = bertattn.Bert.load(tiny_checkpoint, threads=1)
    hf = transformers.AutoTokenizer.from_pretrained(tiny_checkpoint)
    width = bert.model.config.hidden_size
    want = [t.numpy() for t in bert.encode(TEXTS, output_value="token_embeddings")]
    assert bert.pooling == "mean"  # the tiny (plain) folder's, as sentence-transformers
    late = bert.encode_late_chunks(DOC, SPANS, pooling="mean")
    late_long = bert.encode_late_chunks(LONG, SPANS_LONG, pooling="mean")
    late_max = bert.encode_late_chunks(DOC, SPANS, pooling="max", normalize=False)
    ids = [hf(t)["input_ids"] for t in TEXTS]
    args = ("--threads", "1", "--max-body-size", "64K", "--max-batch-tokens", "1024")
    args += ("--max-queue-tokens", "2048")
    with running_server(cli_subprocess, tiny_checkpoint, *args) as server:
        _embed_all_answers(server, want, width)
        _late_chunks_answer(server, (late, late_long, late_max), width)
        _decode_and_tokenize(server, hf, ids)
        _bad_token_bodies_refused(server, late)
        info = httpx.get(server.url + "/info", timeout=10).json()
        assert "/embed_all" in info["routes"] and "/embed_late_chunks" in info["routes"]
        drained(server)


def _embed_all_answers(server, want: list, width: int) -> None:  # type: ignore[no-untyped-def]
    """/embed_all: every token's vector (``want``), as JSON lists, base64 and float16."""
    r = post(server, "/embed_all", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [len(g) for g in got] == [len(w) for w in want]  # every token, [CLS] / [SEP] too
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), w, atol=1e-5)
    one = post(server, "/embed_all", {"inputs": TEXTS[0]}).json()
    np.testing.assert_allclose(np.array(one[0]), want[0], atol=1e-5)  # a list of one
    b64 = post(server, "/embed_all", {"inputs": TEXTS, "encoding_format": "base64"}).json()
    for g, w in zip(b64, want, strict=True):
        np.testing.assert_allclose(matrix(g, width), w, atol=1e-5)
    half = post(
        server,
        "/embed_all",
        {"inputs": TEXTS, "encoding_format": "base64", "dtype": "float16"},
    ).json()
    for g, w in zip(half, want, strict=True):
        np.testing.assert_array_equal(matrix(g, width, "<f2"), w.astype(np.float16))


def _late_chunks_answer(server, late: tuple, width: int) -> None:  # type: ignore[no-untyped-def]
    """/embed_late_chunks: the spans' rows ``late`` gives (DOC by mean, LONG in windows, DOC by
    max not normalized), as JSON lists and base64."""
    late, late_long, late_max = late
    r = post(server, "/embed_late_chunks", {"text": DOC, "spans": SPANS, "pooling": "mean"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()), late, atol=1e-5)
    r = post(server, "/embed_late_chunks", {"text": LONG, "spans": SPANS_LONG, "pooling": "mean"})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()), late_long, atol=1e-5)  # in windows
    body = {"text": DOC, "spans": SPANS, "pooling": "max", "normalize": False}
    np.testing.assert_allclose(
        np.array(post(server, "/embed_late_chunks", body).json()), late_max, atol=1e-5
    )
    body = {"text": DOC, "spans": SPANS, "pooling": "mean", "encoding_format": "base64"}
    rows = post(server, "/embed_late_chunks", body).json()
    np.testing.assert_allclose(np.stack([matrix(x, width)[0] for x in rows]), late, atol=1e-5)


def _decode_and_tokenize(server, hf, ids: list) -> None:  # type: ignore[no-untyped-def]
    """/decode and /tokenize answer as transformers' tokenizer ``hf``."""
    r = post(server, "/decode", {"ids": ids, "skip_special_tokens": False})
    assert r.json() == [hf.decode(i) for i in ids]
    r = post(server, "/decode", {"ids": ids[0]})
    assert r.json() == [hf.decode(ids[0], skip_special_tokens=True)]
    toks = post(server, "/tokenize", {"inputs": TEXTS[1], "add_special_tokens": False}).json()
    assert [t["id"] for t in toks[0]] == hf(TEXTS[1], add_special_tokens=False)["input_ids"]


def _bad_token_bodies_refused(server, late) -> None:  # type: ignore[no-untyped-def]
    """Bad bodies of the token routes: one envelope naming the field."""
    refused(post(server, "/embed_all", {"inputs": 3}), 400, "inputs", "got a number")
    refused(post(server, "/embed_all", {"inputs": ["a", 1]}), 400, "inputs[1]")
    refused(
        post(server, "/embed_all", {"inputs": "a", "encoding_format": "hex"}),
        400, "encoding_format", "'hex'", "'base64'",
    )  # fmt: skip
    refused(
        post(server, "/embed_all", {"inputs": "a", "dtype": "float16"}),
        400, "dtype", "'encoding_format': 'base64'",
    )  # fmt: skip
    big = {"inputs": [LONG] * 8}  # 8 x 128 tokens x 32 values x 16 bytes > 64K
    refused(post(server, "/embed_all", big), 413, None, "--max-body-size", "65536", "base64")
    refused(
        post(server, "/embed_all", {"inputs": [LONG], "truncate": False}),
        400, "inputs[0]", "more than this server's limit of 128",
    )  # fmt: skip
    refused(post(server, "/decode", {"ids": "abc"}), 400, "ids", "token ids")
    refused(post(server, "/decode", {"ids": [[1, 2], [10**9]]}), 400, "ids[1][0]", "0..")
    refused(post(server, "/decode", {"ids": [1], "skip": True}), 400, "skip", "'skip'")
    refused(
        post(server, "/embed_late_chunks", {"text": DOC, "spans": [[0, 10], [5, 500]]}),
        400, "spans[1]", "out of range",
    )  # fmt: skip
    refused(
        post(server, "/embed_late_chunks", {"text": DOC, "spans": [[0, "9"]]}),
        400, "spans[0]", "two integers",
    )  # fmt: skip
    refused(
        post(server, "/embed_late_chunks", {"text": DOC, "spans": [[33, 34]], **MEAN}),
        400, "spans[0]", "holds no token",
    )  # fmt: skip
    refused(post(server, "/embed_late_chunks", {"spans": SPANS}), 400, "text", "missing")
    huge = {"text": "word " * 3000, "spans": [[0, 10]], **MEAN}  # 3,000 tokens > the queue
    refused(
        post(server, "/embed_late_chunks", huge),
        413, "text", "more than 2048 tokens", "--max-queue-tokens",
    )  # fmt: skip
    wide = {"text": LONG, "spans": SPANS, **MEAN, "overlap": 500}  # a window holds 126
    refused(post(server, "/embed_late_chunks", wide), 400, "overlap", "overlap")
    # the plain folder pools by mean: its spans' means, as pooling "mean" gives them
    r = post(server, "/embed_late_chunks", {"text": DOC, "spans": SPANS})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.array(r.json()), late, atol=1e-5)
    refused(
        post(server, "/embed_late_chunks", {"text": DOC, "spans": SPANS, "pooling": "cls"}),
        400, "pooling", "'mean' or 'max'",
    )  # fmt: skip
    refused(
        post(server, "/embed_multi_vector", {"inputs": "a"}),
        400, None, "sentence-embedding model", "POST /embed_late_chunks",
    )  # fmt: skip
    refused(post(server, "/embed_m3", {"inputs": "a"}), 400, None, "not POST /embed_m3")


# ---------------------------------------------------------------------- a multi-vector model
@pytest.fixture(scope="module")
def multi_vector_dir(minilm_dir, tmp_path_factory):  # type: ignore[no-untyped-def]
    from test_multi_vector import build

    return build(
        minilm_dir,
        tmp_path_factory.mktemp("mvs") / "colbert-minilm",
        prompts={"query": "query: ", "document": "passage: "},
    )


QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital of France.",
    "Berlin!",
    "Shakespeare wrote Hamlet around 1600; it is a tragedy. " * 8,
    "Attention weighs every token.",
]


def test_multi_vector_model_routes(cli_subprocess, multi_vector_dir):
    model = MultiVectorEncoder(multi_vector_dir, threads=1)
    q = model.encode_query(DOCS[:2] + [QUERY])
    d = model.encode_document(DOCS)
    d16 = model.encode_document(DOCS, truncate_dim=16)
    scores = model.similarity(model.encode_query([QUERY]), d)[0].numpy()
    hidden = [t.numpy() for t in model.bert.encode(DOCS, output_value="token_embeddings")]
    with running_server(cli_subprocess, multi_vector_dir, "--threads", "1") as server:
        r = post(server, "/embed_multi_vector", {"inputs": DOCS[:2] + [QUERY], "task": "query"})
        assert r.status_code == 200, r.text
        for g, w in zip(r.json(), q, strict=True):
            np.testing.assert_allclose(np.array(g), w.numpy(), atol=1e-5)
        got = post(server, "/embed_multi_vector", {"inputs": DOCS}).json()  # task: document
        assert [len(g) for g in got] == [len(w) for w in d]  # the skip-list's rows left out
        for g, w in zip(got, d, strict=True):
            np.testing.assert_allclose(np.array(g), w.numpy(), atol=1e-5)
        cut = post(server, "/embed_multi_vector", {"inputs": DOCS, "dimensions": 16}).json()
        for g, w in zip(cut, d16, strict=True):
            np.testing.assert_allclose(np.array(g), w.numpy(), atol=1e-5)
        b64 = post(
            server, "/embed_multi_vector", {"inputs": DOCS, "encoding_format": "base64"}
        ).json()
        for g, w in zip(b64, d, strict=True):
            np.testing.assert_allclose(matrix(g, 128), w.numpy(), atol=1e-5)

        r = post(server, "/rerank", {"query": QUERY, "texts": DOCS, "return_text": True})
        assert r.status_code == 200, r.text
        order = list(np.argsort(-scores, kind="stable"))
        assert [x["index"] for x in r.json()] == order
        assert [x["text"] for x in r.json()] == [DOCS[i] for i in order]
        np.testing.assert_allclose([x["score"] for x in r.json()], scores[order], atol=1e-4)
        v1 = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}).json()
        assert [x["index"] for x in v1["results"]] == order[:2]
        np.testing.assert_allclose(
            [x["relevance_score"] for x in v1["results"]], scores[order[:2]], atol=1e-4
        )
        all_ = post(server, "/embed_all", {"inputs": DOCS}).json()
        for g, w in zip(all_, hidden, strict=True):
            np.testing.assert_allclose(np.array(g), w, atol=1e-5)

        refused(
            post(server, "/embed_multi_vector", {"inputs": "a", "task": "passage"}),
            400, "task", "'query' or 'document'",
        )  # fmt: skip
        refused(
            post(server, "/embed_multi_vector", {"inputs": "a", "prompt_name": "nope"}),
            400, "prompt_name", "['document', 'query']",
        )  # fmt: skip
        refused(
            post(server, "/embed_multi_vector", {"inputs": "a", "dimensions": 129}),
            400, "dimensions", "1..128",
        )  # fmt: skip
        refused(
            post(server, "/v1/rerank", {"model": "nope", "query": QUERY, "documents": DOCS}),
            404, "model", "'nope'",
        )  # fmt: skip
        refused(
            post(
                server,
                "/v1/rerank",
                {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 20},
            ),
            400, "max_tokens_per_doc", "multi-vector",
        )  # fmt: skip
        refused(post(server, "/rerank", {"query": 1, "texts": DOCS}), 400, "query", "a number")
        refused(
            post(server, "/embed_late_chunks", {"text": DOC, "spans": SPANS}),
            400, None, "multi-vector", "not POST /embed_late_chunks",
        )  # fmt: skip
        refused(post(server, "/predict", {"inputs": "a"}), 400, None, "POST /embed_multi_vector")
        drained(server)


# ---------------------------------------------------------------------- a bge-m3-shaped model
@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    from test_family_roberta import save_family

    out = save_family("xlm-roberta", tmp_path_factory.mktemp("m3s") / "m3", seed=2)
    g = torch.Generator().manual_seed(7)
    torch.save(
        {"weight": torch.randn(24, 32, generator=g) * 0.3, "bias": torch.randn(24, generator=g)},
        out / "colbert_linear.pt",
    )
    torch.save(
        {"weight": torch.randn(1, 32, generator=g) * 0.3, "bias": torch.zeros(1) + 0.05},
        out / "sparse_linear.pt",
    )
    return out


def test_m3_model_routes(cli_subprocess, m3_dir):
    model = M3Encoder(m3_dir, threads=1)
    want = model.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    with running_server(cli_subprocess, m3_dir, "--threads", "1") as server:
        body = {
            "inputs": TEXTS,
            "return_dense": True,
            "return_sparse": True,
            "return_colbert_vecs": True,
        }
        r = post(server, "/embed_m3", body)
        assert r.status_code == 200, r.text
        got = r.json()
        np.testing.assert_allclose(np.array(got["dense_vecs"]), want["dense_vecs"], atol=1e-5)
        for g, w in zip(got["colbert_vecs"], want["colbert_vecs"], strict=True):
            np.testing.assert_allclose(np.array(g), w, atol=1e-5)
        for g, w in zip(got["lexical_weights"], want["lexical_weights"], strict=True):
            assert [x["index"] for x in g] == sorted(int(k) for k in w)  # /embed_sparse's shape
            np.testing.assert_allclose(
                [x["value"] for x in g], [w[str(x["index"])] for x in g], atol=1e-5
            )
        dense = post(server, "/embed_m3", {"inputs": TEXTS[0]}).json()  # FlagEmbedding's default
        assert dense["lexical_weights"] is None and dense["colbert_vecs"] is None
        np.testing.assert_allclose(dense["dense_vecs"], want["dense_vecs"][0], atol=1e-5)
        b64 = post(
            server, "/embed_m3", {**body, "encoding_format": "base64", "dtype": "float16"}
        ).json()
        for g, w in zip(b64["colbert_vecs"], want["colbert_vecs"], strict=True):
            np.testing.assert_array_equal(matrix(g, 24, "<f2"), w.astype(np.float16))

        refused(
            post(server, "/embed_m3", {"inputs": "a", "return_dense": False}),
            400, "return_dense", "at least one output",
        )  # fmt: skip
        refused(
            post(server, "/embed_m3", {"inputs": "a", "return_sparse": "yes"}),
            400, "return_sparse", "true or false",
        )  # fmt: skip
        refused(post(server, "/embed_m3", {"inputs": "a", "max_length": 2}), 400, "max_length")
        refused(post(server, "/embed", {"inputs": "a"}), 400, None, "bge-m3", "POST /embed_m3")
        drained(server)


def test_m3_and_multi_vector_folders_are_recognised(multi_vector_dir, m3_dir, tmp_path):
    from bertattn.heads.auto import resolve_auto

    assert resolve_auto(multi_vector_dir)[1] == "multi-vector"
    assert resolve_auto(m3_dir)[1] == "m3"
    plain = shutil.copytree(m3_dir, tmp_path / "plain")
    (plain / "sparse_linear.pt").unlink()  # one linear layer alone: a plain encoder
    assert resolve_auto(plain)[1] == "embedding"
