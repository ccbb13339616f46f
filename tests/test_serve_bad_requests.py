"""A catalogue of hostile and malformed requests to a real ``bertattn serve``: each gets its 4xx
in OpenAI's error envelope with a message naming the field, never a 500 or a hang, and the server
stays live afterwards."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_server import running_server

pytestmark = pytest.mark.slow  # one server subprocess for the module

NAME = "tiny"  # the served name (the checkpoint folder's): "@NAME" in the bodies below
JSON = {"content-type": "application/json"}


def _body(obj: object) -> bytes:
    return json.dumps(obj).encode()  # "@NAME": the served name, put in by the test


def ok(**fields: object) -> dict:
    return {"model": "@NAME", "input": "hello", **fields}


# (id, method, path, headers, body, status, param or None, words the message must hold)
CASES = [
    ("array-body", "POST", "/v1/embeddings", JSON, b"[1]", 400, None, "JSON object"),
    ("string-body", "POST", "/v1/embeddings", JSON, b'"hi"', 400, None, "JSON object"),
    ("not-json", "POST", "/v1/embeddings", JSON, b"input=hello", 400, None, "not valid JSON"),
    ("truncated-json", "POST", "/v1/embeddings", JSON, b'{"input": "a', 400, None, "JSON"),
    ("invalid-utf8", "POST", "/v1/embeddings", JSON, b'{"input": "\xff\xfe"}', 400, None, "UTF-8"),
    ("deep-json", "POST", "/v1/embeddings", JSON, b"[" * 200_000 + b"]" * 200_000, 400, None,
     "nested too deeply"),
    ("deep-input", "POST", "/v1/embeddings", JSON,
     b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None, "nested too deeply"),
    ("empty-body", "POST", "/v1/embeddings", JSON, b"", 400, None, "empty"),
    ("text-plain", "POST", "/v1/embeddings", {"content-type": "text/plain"}, _body(ok()), 415,
     None, "Content-Type"),
    ("no-content-type", "POST", "/v1/embeddings", {}, _body(ok()), 415, None, "Content-Type"),
    ("missing-input", "POST", "/v1/embeddings", JSON, _body({"model": "@NAME"}), 400, "input",
     "'input' is required"),
    ("input-number", "POST", "/v1/embeddings", JSON, _body(ok(input=5)), 400, "input", "input"),
    ("input-object", "POST", "/v1/embeddings", JSON, _body(ok(input={"a": 1})), 400, "input",
     "an object"),
    ("input-empty-list", "POST", "/v1/embeddings", JSON, _body(ok(input=[])), 400, "input",
     "empty"),
    ("input-mixed-str", "POST", "/v1/embeddings", JSON, _body(ok(input=["a", 3])), 400,
     "input[1]", "input[1]"),
    ("input-mixed-ids", "POST", "/v1/embeddings", JSON, _body(ok(input=[1, "a"])), 400,
     "input[1]", "input[1]"),
    ("input-ids-then-str", "POST", "/v1/embeddings", JSON, _body(ok(input=[[1, 2], "x"])), 400,
     "input[1]", "input[1]"),
    ("input-empty-ids", "POST", "/v1/embeddings", JSON, _body(ok(input=[[]])), 400, "input[0]",
     "empty"),
    ("huge-id", "POST", "/v1/embeddings", JSON, _body(ok(input=[10**30])), 400, "input[0]",
     "token id"),
    ("negative-id", "POST", "/v1/embeddings", JSON, _body(ok(input=[[2, -1, 3]])), 400,
     "input[0][1]", "token id"),
    ("id-past-vocab", "POST", "/v1/embeddings", JSON, _body(ok(input=[2, 99, 3])), 400,
     "input[1]", "0..98"),
    ("bool-input", "POST", "/v1/embeddings", JSON, _body(ok(input=[True])), 400, "input[0]",
     "boolean"),
    ("million-items", "POST", "/v1/embeddings", JSON, _body(ok(input=["a"] * 1_000_000)), 413,
     "input", "at most 2048"),
    ("million-ids", "POST", "/v1/embeddings", JSON, _body(ok(input=[5] * 1_000_000)), 400,
     "input[0]", "1000000 token ids"),
    ("4301-digit-int", "POST", "/v1/embeddings", JSON,
     b'{"model": "x", "input": [' + b"9" * 5000 + b"]}", 400, None, "not valid JSON"),
    ("nan-literal", "POST", "/v1/embeddings", JSON, b'{"input": "a", "dimensions": NaN}', 400,
     None, "NaN"),
    ("unknown-model", "POST", "/v1/embeddings", JSON, _body(ok(model="gpt-4")), 404, "model",
     "gpt-4"),
    ("missing-model", "POST", "/v1/embeddings", JSON, _body({"input": "a"}), 400, "model",
     "'model' is required"),
    ("model-number", "POST", "/v1/embeddings", JSON, _body(ok(model=5)), 400, "model",
     "'model' must be a string"),
    ("format-int8", "POST", "/v1/embeddings", JSON, _body(ok(encoding_format="int8")), 400,
     "encoding_format", "'float' or 'base64'"),
    ("dimensions-0", "POST", "/v1/embeddings", JSON, _body(ok(dimensions=0)), 400, "dimensions",
     "1..32"),
    ("dimensions-wide", "POST", "/v1/embeddings", JSON, _body(ok(dimensions=33)), 400,
     "dimensions", "32 dimensions"),
    ("dimensions-string", "POST", "/v1/embeddings", JSON, _body(ok(dimensions="8")), 400,
     "dimensions", "integer"),
    ("dimensions-inf", "POST", "/v1/embeddings", JSON,
     b'{"model": "@NAME", "input": "a", "dimensions": 1e400}', 400, "dimensions", "integer"),
    ("user-number", "POST", "/v1/embeddings", JSON, _body(ok(user=5)), 400, "user", "'user'"),
    ("unknown-field", "POST", "/v1/embeddings", JSON, _body(ok(temperature=1)), 400,
     "temperature", "temperature"),
    ("timeout-header", "POST", "/v1/embeddings", {**JSON, "x-request-timeout": "soon"},
     _body(ok()), 400, "X-Request-Timeout", "X-Request-Timeout"),
    ("timeout-negative", "POST", "/v1/embeddings", {**JSON, "x-request-timeout": "-1"},
     _body(ok()), 400, "X-Request-Timeout", "seconds > 0"),
    ("body-too-large", "POST", "/v1/embeddings", JSON, b'{"input": "' + b"a" * (17 << 20) + b'"}',
     413, None, "--max-body-size"),
    ("embed-ids", "POST", "/embed", JSON, _body({"inputs": [1, 2]}), 400, "inputs[0]",
     "inputs[0]"),
    ("embed-missing", "POST", "/embed", JSON, _body({"input": "a"}), 400, "input",
     "unrecognized"),
    ("embed-normalize", "POST", "/embed", JSON, _body({"inputs": "a", "normalize": "yes"}), 400,
     "normalize", "true or false"),
    ("embed-direction", "POST", "/embed", JSON,
     _body({"inputs": "a", "truncation_direction": "left"}), 400, "truncation_direction",
     "'right'"),
    ("tokenize-missing", "POST", "/tokenize", JSON, _body({}), 400, "inputs",
     "'inputs' is required"),
    ("tokenize-special", "POST", "/tokenize", JSON,
     _body({"inputs": "a", "add_special_tokens": 1}), 400, "add_special_tokens", "true or false"),
    ("get-embeddings", "GET", "/v1/embeddings", {}, b"", 405, None, "GET"),
    ("no-route", "POST", "/v2/embeddings", JSON, _body(ok()), 404, None, "/v2/embeddings"),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(cli_subprocess, tiny_checkpoint):
    global NAME
    NAME = tiny_checkpoint.name
    with running_server(cli_subprocess, tiny_checkpoint, "--threads", "1") as s:
        yield s


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case):
    _, method, path, headers, body, status, param, words = case
    body = body.replace(b'"@NAME"', b'"' + NAME.encode() + b'"')
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.request(method, path, headers=headers, content=body)
        assert r.status_code == status, r.text[:500]
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        assert words in error["message"], error
        if param is not None:
            assert error["param"] == param, error
        assert client.get("/live").status_code == 200
