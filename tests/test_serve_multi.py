"""Several models in one server: an embedder and a reranker (and a SPLADE model) side by side,
each on its own queue and worker; a request goes to the model its body names, else to the one
model that answers its route; answers equal each model's own Python API."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
from test_heads_cross_encoder import save_classifier

from bertattn import Bert, CrossEncoder, SparseEncoder
from bertattn.serve import create_app


@pytest.fixture(scope="module")
def models(tiny_checkpoint, splade_dir, tmp_path_factory):  # type: ignore[no-untyped-def]
    reranker = save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr"), 1, seed=3)
    return (
        Bert.load(tiny_checkpoint, threads=1),
        CrossEncoder(reranker, threads=1),
        SparseEncoder(splade_dir, threads=1),
    )


def ask(app, calls):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return [await (c.get(p) if b is None else c.post(p, json=b)) for p, b in calls]

    try:
        return asyncio.run(go())
    finally:
        app.state.serve.batcher.stop(10)


def test_each_request_reaches_its_model(models):
    bert, ce, splade = models
    emb_name, rr_name, sp_name = bert.name, ce.bert.name, splade.bert.name
    app = create_app(list(models), max_batch_tokens=1024)
    texts = ["the attention head", "hello world"]
    docs = ["looks at every token", "hello", "bert model layer"]
    r = ask(
        app,
        [
            ("/v1/embeddings", {"model": emb_name, "input": texts}),
            ("/embed", {"inputs": texts}),  # only the embedder answers /embed
            ("/v1/rerank", {"model": rr_name, "query": texts[0], "documents": docs}),
            ("/rerank", {"query": texts[0], "texts": docs}),
            ("/embed_sparse", {"inputs": texts}),
            ("/tokenize", {"model": sp_name, "inputs": texts}),
            ("/v1/models", None),
            ("/info", None),
            ("/metrics", None),
        ],
    )
    assert all(x.status_code == 200 for x in r), [x.text for x in r]
    rows = np.array([d["embedding"] for d in r[0].json()["data"]], np.float32)
    np.testing.assert_allclose(rows, bert.encode(texts), atol=1e-6)
    np.testing.assert_allclose(
        np.array(r[1].json(), np.float32), bert.encode(texts, normalize=True), atol=1e-6
    )
    want = ce.rank(texts[0], docs)
    assert [d["index"] for d in r[2].json()["results"]] == [d["corpus_id"] for d in want]
    assert [d["index"] for d in r[3].json()] == [d["corpus_id"] for d in want]
    dense = splade.encode(texts, convert_to_sparse_tensor=False)
    assert [d["index"] for d in r[4].json()[0]] == dense[0].nonzero().flatten().tolist()
    assert r[5].status_code == 200  # /tokenize with a model named
    served = [s.names[0] for s in app.state.serve.states]  # a folder: its own name first
    assert [m["id"] for m in r[6].json()["data"]] == served
    assert served == [n.rstrip("/").rsplit("/", 1)[-1] for n in (emb_name, rr_name, sp_name)]
    assert [m["model_type"] for m in r[7].json()["models"]] == ["embedding", "reranker", "sparse"]
    assert 'route="rerank",status="200"} 2' in r[8].text


def test_a_request_that_names_no_model_where_several_answer(models):
    app = create_app(list(models), max_batch_tokens=1024)
    r = ask(
        app,
        [
            ("/tokenize", {"inputs": "hello"}),  # every model tokenizes
            ("/v1/embeddings", {"model": "nobody", "input": "a"}),
            ("/v1/embeddings", {"model": models[1].bert.name, "input": "a"}),  # a reranker
            ("/predict", {"model": models[0].name, "inputs": "a"}),  # an embedder
        ],
    )
    assert r[0].status_code == 400 and "name one with" in r[0].text
    assert r[1].status_code == 404 and "does not exist here" in r[1].text
    assert r[2].status_code == 400 and "a reranker" in r[2].text
    assert r[3].status_code == 400 and "sentence-embedding model" in r[3].text


def test_names_name_one_model(models):
    with pytest.raises(ValueError, match="several models are served under their own names"):
        create_app(list(models), max_batch_tokens=1024, served_name="x")


@pytest.mark.parametrize("one_worker", [False, True], ids=["worker-per-model", "one-worker"])
def test_concurrent_mixed_traffic(models, one_worker):
    """Embeddings and reranks at once: each answer equals its model's Python API; with
    ``one_worker`` the two models' batches never run at the same time."""
    bert, ce, _ = models
    app = create_app(list(models[:2]), max_batch_tokens=1024, one_worker=one_worker)
    running, most = [0], [0]
    lock = threading.Lock()
    for state in app.state.serve.states:
        compute = state.batcher.step.compute

        def counted(encodings, compute=compute):  # type: ignore[no-untyped-def]
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                time.sleep(0.02)  # long enough for the other model's worker to start a batch
                return compute(encodings)
            finally:
                with lock:
                    running[0] -= 1

        state.batcher.step.compute = counted
        if one_worker:  # the wrapper calls the shared step's own: count there too
            state.batcher.step._step.compute = counted
    texts = [f"the attention head looks at token {i}" for i in range(8)]
    docs = ["looks at every token", "hello", "bert model layer"]

    async def go():  # type: ignore[no-untyped-def]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            embeds = [c.post("/embed", json={"inputs": texts[i : i + 2]}) for i in range(0, 8, 2)]
            ranks = [c.post("/rerank", json={"query": t, "texts": docs}) for t in texts]
            return await asyncio.gather(*embeds, *ranks)

    try:
        answers = asyncio.run(go())
    finally:
        app.state.serve.batcher.stop(10)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    got = np.concatenate([np.array(a.json(), np.float32) for a in answers[:4]])
    np.testing.assert_allclose(got, bert.encode(texts, normalize=True), atol=1e-6)
    for t, a in zip(texts, answers[4:], strict=True):
        assert [d["index"] for d in a.json()] == [d["corpus_id"] for d in ce.rank(t, docs)]
    if one_worker:
        assert most[0] == 1, most
    assert most[0] >= 1  # the steps ran through the counting wrapper


def test_turn_taking_is_first_come_first_served():
    """A thread waiting for its turn is served before a thread that asks later, even one that
    just had its turn (a plain lock lets it take the turn again at once)."""
    from bertattn.engine import TurnTaking

    turns = TurnTaking()
    order: list[str] = []
    turns.__enter__()  # held: the others queue in a known order

    def take(name: str) -> None:
        with turns:
            order.append(name)

    threads = []
    for name in ("b", "c", "d"):
        t = threading.Thread(target=take, args=(name,))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 10
        while turns._next < len(threads) + 1 and time.monotonic() < deadline:
            time.sleep(0.001)  # until this one holds its ticket
    turns.__exit__()
    for t in threads:
        t.join(10)
    assert order == ["b", "c", "d"]


def test_turn_taking_survives_deepcopy_and_pickle():
    """A copy is a turn of its own: nobody waiting, usable at once (its Condition is new)."""
    import copy
    import pickle

    from bertattn.engine import TurnTaking

    turns = TurnTaking()
    with turns:  # one caller holds the original's turn
        for other in (copy.deepcopy(turns), pickle.loads(pickle.dumps(turns))):
            with other:  # not blocked by the original
                assert other._next - other._serving == 1
            assert other._next == other._serving == 1
    assert turns._next == turns._serving == 1  # the count back to zero waiting


def test_one_worker_needs_several_models(models):
    with pytest.raises(ValueError, match="one_worker applies to several models"):
        create_app(models[0], one_worker=True)


@pytest.mark.slow
def test_serve_two_models_on_one_worker(cli_subprocess, tiny_checkpoint, models, tmp_path):
    from serve_server import running_server

    reranker = save_classifier(tiny_checkpoint, tmp_path / "rr", 1, seed=3)
    bert, ce, _ = models
    with running_server(
        cli_subprocess, tiny_checkpoint, "--model", reranker, "--threads", "1", "--one-worker"
    ) as server:
        e = httpx.post(
            server.url + "/v1/embeddings",
            json={"model": tiny_checkpoint.name, "input": ["hello world"]},
            timeout=30,
        )
        r = httpx.post(
            server.url + "/v1/rerank",
            json={"model": "rr", "query": "the attention head", "documents": ["hello", "ok"]},
            timeout=30,
        )
        assert e.status_code == 200 and r.status_code == 200, (e.text, r.text)
        np.testing.assert_allclose(
            [e.json()["data"][0]["embedding"]], bert.encode(["hello world"]), atol=1e-6
        )
        want = ce.rank("the attention head", ["hello", "ok"])
        assert [d["index"] for d in r.json()["results"]] == [d["corpus_id"] for d in want]
        models_listed = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models_listed] == [tiny_checkpoint.name, "rr"]


def test_one_worker_with_one_model_is_refused(cli, tiny_checkpoint):
    r = cli("serve", "--model", tiny_checkpoint, "--one-worker")
    assert r.code == 2, r
    assert "--one-worker shares one worker between several models" in r.err


def test_served_model_name_with_two_models_is_refused(cli, tiny_checkpoint):
    r = cli(
        "serve", "--model", tiny_checkpoint, "--model", tiny_checkpoint, "--served-model-name", "x"
    )
    assert r.code == 2, r
    assert "--served-model-name names one model" in r.err
