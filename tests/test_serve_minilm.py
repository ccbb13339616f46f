"""The real all-MiniLM-L6-v2 behind `bertattn serve`: /v1/embeddings rows equal
``Bert.load(minilm_dir).encode`` (normalized), and ``dimensions`` cuts then renormalizes."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from serve_server import running_server

pytestmark = pytest.mark.slow  # the real checkpoint in a server subprocess

TEXTS = [
    "The animal didn't cross the street because it was too tired.",
    "A man is playing a guitar.",
    "Embeddings map sentences to vectors; similar meanings land close together. " * 8,
    "短い文",
    "ok",
]


def test_minilm_rows_equal_encode(cli_subprocess, minilm_dir):
    from bertattn import Bert

    bert = Bert.load(minilm_dir, threads=1)
    expect = bert.encode(TEXTS)
    with running_server(cli_subprocess, minilm_dir) as server:  # the thread policy's governor
        info = httpx.get(server.url + "/info", timeout=10).json()
        name = info["model_id"]
        r = httpx.post(
            server.url + "/v1/embeddings", json={"model": name, "input": TEXTS}, timeout=60
        )
        assert r.status_code == 200, r.text
        rows = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        np.testing.assert_allclose(rows, expect, atol=1e-6, rtol=0)
        cut = httpx.post(
            server.url + "/v1/embeddings",
            json={"model": name, "input": TEXTS, "dimensions": 64},
            timeout=60,
        )
        assert cut.status_code == 200, cut.text
        short = np.array([d["embedding"] for d in cut.json()["data"]], np.float32)
        want = expect[:, :64] / np.linalg.norm(expect[:, :64], axis=1, keepdims=True)
        np.testing.assert_allclose(short, want, atol=1e-6, rtol=0)
    assert info["dimensions"] == 384 and info["normalize"] is True
