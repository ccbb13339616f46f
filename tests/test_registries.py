"""The two registries of docs/development.md, extended from here without touching a file of
``bertattn.serve`` or ``bertattn.jobs``: a toy head kind (a model that counts each input's
tokens), detected from a toy folder, loaded, and served by a real server on a toy route."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from bertattn import Bert
from bertattn.engine import ModelStep
from bertattn.heads import registry
from bertattn.heads.auto import load_auto, resolve_auto
from bertattn.heads.registry import HeadKind

MARKER = "toy_counter.json"
TEXTS = ["the cat sat", "a much longer sentence about the cat that sat on the mat"]


class TokenCounter:
    """The toy head: the real tokens of each input, counted from the encoder's mask."""

    def __init__(self, folder: Any, **load: Any) -> None:
        self.bert = Bert.load(folder, **load)

    def step(self) -> ModelStep:
        def compute(encodings: list[Any]) -> torch.Tensor:
            _, mask, hidden = self.bert.forward_encodings(encodings)  # mask (B, L)
            assert hidden.shape[:2] == mask.shape
            return mask.sum(dim=1, keepdim=True).float()  # (B, 1)

        return ModelStep(self.bert, compute, "scores")


async def count_tokens(state: Any, request: Any) -> Any:
    """``POST /toy_count {"texts": [...]}`` -> ``{"tokens": [n, ...]}``."""
    from bertattn.serve.errors import ApiError
    from bertattn.serve.handling import json_response, read_body, run_model
    from bertattn.serve.tokens import tokenize_inputs

    body = await read_body(state, request)
    texts = body.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "'texts' must be a list of strings.", param="texts")
    encodings, counts = await state.tokenize(
        tokenize_inputs, texts, state.max_input_tokens, True, "texts"
    )
    rows = await run_model(state, request, encodings, counts, "texts")  # (N, 1)
    return json_response({"tokens": [int(r[0]) for r in rows]})


TOY = HeadKind(
    "token-counter",
    describe=lambda model: "a toy token counter",
    detect=lambda probe: bool(probe.text(MARKER)),
    load=lambda probe, **load: TokenCounter(probe.folder, **load),
    served="toy",
    routes=("/toy_count",),
    answers=lambda model: isinstance(model, TokenCounter),
)


@pytest.fixture
def toy_kind() -> Iterator[HeadKind]:
    """The toy kind and its route, registered for one test."""
    from bertattn.serve.routes import ServeRoute, register_route, unregister_route

    registry.register(TOY)
    register_route(ServeRoute("/toy_count", "toy_count", count_tokens))
    try:
        yield TOY
    finally:
        unregister_route("/toy_count")
        registry.unregister(TOY.name)


@pytest.fixture
def toy_dir(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "toy"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / MARKER).write_text("{}\n", encoding="utf-8")
    return folder


def test_a_registered_kind_is_detected_from_its_folder_and_loaded(
    toy_kind, toy_dir, tiny_checkpoint
):
    kind, probe = registry.detect(toy_dir)
    assert kind is toy_kind and registry.find("toy") is toy_kind
    assert resolve_auto(toy_dir) == (probe.folder, "token-counter")
    assert resolve_auto(tiny_checkpoint)[1] == "embedding"  # no marker: the built-in kinds
    assert isinstance(load_auto(toy_dir, threads=1), TokenCounter)


def test_a_kind_is_registered_once(toy_kind):
    with pytest.raises(
        ValueError, match="'token-counter' is registered already .* a name of its own"
    ):
        registry.register(TOY)
    registry.unregister(TOY.name)
    assert registry.find("token-counter") is None
    registry.register(TOY)  # for the fixture to take away


def test_the_route_table_names_the_kinds_of_a_registered_route(toy_kind):
    from bertattn.serve.routes import ROUTES, ServeRoute, register_route

    row = next(r for r in ROUTES if r.path == "/toy_count")
    assert row.kinds() == ("token-counter",)
    assert "token-counter" in next(r for r in ROUTES if r.path == "/tokenize").kinds()
    with pytest.raises(ValueError, match="POST /toy_count is in the route table already"):
        register_route(ServeRoute("/toy_count", "again", count_tokens))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(toy_kind, toy_dir, tiny_checkpoint) -> Iterator[str]:
    """A real server on a free port of 127.0.0.1 with two models: the toy and an encoder."""
    import uvicorn

    from bertattn.serve import create_app

    app = create_app([load_auto(toy_dir, threads=1), Bert.load(tiny_checkpoint, threads=1)])
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.mark.slow
def test_a_real_server_answers_the_toy_route_with_the_toy_model(served, tiny_checkpoint):
    import httpx
    from transformers import AutoTokenizer

    want = [len(ids) for ids in AutoTokenizer.from_pretrained(tiny_checkpoint)(TEXTS)["input_ids"]]
    r = httpx.post(served + "/toy_count", json={"texts": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json() == {"tokens": want}  # the one model that answers it: no "model" needed
    info = httpx.get(served + "/info", timeout=60).json()
    assert [m["model_type"] for m in info["models"]] == ["toy", "embedding"]
    assert info["models"][0]["routes"] == ["/toy_count"]
    assert info["models"][0]["head"] == "a toy token counter"
    embedder = info["models"][1]["model_id"]
    r = httpx.post(served + "/toy_count", json={"texts": TEXTS, "model": embedder}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_route_for_model", r.text
    assert "answers POST /v1/embeddings" in r.json()["error"]["message"]
    r = httpx.post(served + "/embed", json={"inputs": TEXTS}, timeout=60)  # the encoder's own
    assert r.status_code == 200 and len(r.json()) == 2, r.text


def test_the_start_up_line_names_each_models_kind_but_the_default_kinds(toy_kind):
    """``bertattn serve``'s first line: the toy kind is named beside its model, the embedder
    and any other kind marked ``default`` are not."""
    import dataclasses
    from types import SimpleNamespace

    from bertattn.jobs.serve import _serving_line
    from bertattn.serve.served import Served

    bert = SimpleNamespace(threads=None, device="cpu")
    quiet = dataclasses.replace(toy_kind, name="quiet-counter", default=True)
    states = [
        SimpleNamespace(names=(name,), bert=bert, served=Served(kind, None, bert, None))
        for name, kind in (("toy", toy_kind), ("mini", registry.EMBEDDING), ("q", quiet))
    ]
    sock = SimpleNamespace(getsockname=lambda: ("127.0.0.1", 8080))
    line = _serving_line(SimpleNamespace(states=states), sock, "key")
    assert line == (
        "serving toy (a toy token counter), mini, q on http://127.0.0.1:8080 (cpu; API key "
        "required); Ctrl-C or SIGTERM to stop"
    )
