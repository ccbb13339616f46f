"""The API key of a real ``bertattn serve`` (from ``BERTATTN_API_KEY``): data routes need
``Authorization: Bearer KEY`` (401 in the envelope otherwise), /info too (it tells the
model, limits and threads), probes and /metrics stay open,
the openai client works with the key, and texts do not reach the log at -v."""

from __future__ import annotations

import httpx
import pytest
from serve_server import running_server

pytestmark = pytest.mark.slow  # a server subprocess

KEY = "k3y-for-tests"
SECRET_TEXT = "hello secret attention"


@pytest.fixture(scope="module")
def server(cli_subprocess, tiny_checkpoint):
    env = {"BERTATTN_API_KEY": KEY}
    args = ("-v", "--threads", "1", "--served-model-name", "tiny-embed")
    with running_server(cli_subprocess, tiny_checkpoint, *args, env=env) as s:
        yield s


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic x"}],
    ids=["none", "wrong-key", "no-scheme", "basic"],
)
@pytest.mark.parametrize(
    "method, path", [("POST", "/v1/embeddings"), ("POST", "/embed"), ("POST", "/tokenize"),
                     ("GET", "/v1/models"), ("GET", "/info")],
)  # fmt: skip
def test_data_routes_need_the_key(server, tiny_checkpoint, headers, method, path):
    body = {"model": tiny_checkpoint.name, "input": "hi"} if path.startswith("/v1/emb") else None
    if path in ("/embed", "/tokenize"):
        body = {"inputs": "hi"}
    r = httpx.request(method, server.url + path, json=body, headers=headers, timeout=10)
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key", error
    assert "Bearer" in error["message"] or "not valid" in error["message"], error
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("path", ["/live", "/ready", "/health", "/metrics"])
def test_probes_and_metrics_are_open(server, path):
    assert httpx.get(server.url + path, timeout=10).status_code == 200


def test_openai_client_with_the_key(server, tiny_checkpoint):
    from openai import AuthenticationError, OpenAI

    good = OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=30, max_retries=0)
    got = good.embeddings.create(model=tiny_checkpoint.name, input=[SECRET_TEXT, "ok"])
    assert len(got.data) == 2 and len(got.data[0].embedding) == 32
    assert got.model == "tiny-embed"  # --served-model-name; the folder's name stays accepted
    assert [m.id for m in good.models.list()] == ["tiny-embed"]
    assert good.embeddings.create(model="tiny-embed", input="ok").model == "tiny-embed"
    bad = OpenAI(base_url=server.url + "/v1", api_key="nope", timeout=30, max_retries=0)
    with pytest.raises(AuthenticationError):
        bad.embeddings.create(model=tiny_checkpoint.name, input="ok")
    assert "API key required" in server.stderr()
    assert SECRET_TEXT not in server.stderr()  # -v logs what the server does, never the texts
    assert KEY not in server.stderr()
