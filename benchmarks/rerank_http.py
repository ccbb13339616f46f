"""Reranking over HTTP: ``bertattn serve`` (``POST /v1/rerank``) against infinity
(``POST /rerank``, ``--engine torch``), the same reranker folder and the same Cohere-shaped
bodies, in one run.

    BERTATTN_BENCH_INFINITY=.venv-infinity python -m benchmarks.rerank_http \
        [--seconds 10] [--levels 1,4,16] [--rounds 2] [--threads N]

The reranker: all-MiniLM-L6-v2's encoder with a seeded one-label head (the shape of
``cross-encoder/ms-marco-MiniLM-L6-v2``, whose weights are not installable here; the work per
pair is the same). Each request: a query of 8 words and 20 passages of up to 120 words.
Closed-loop clients at each level; the servers alternate level by level and round by round.
Reported: pairs/s (median over rounds) and latency p50 / p95 per server and level, and the
ratio. ``BERTATTN_BENCH_INFINITY``: a virtual environment with ``infinity-emb[server,torch]``
(``make bench-serve`` creates one); without it only bertattn is measured, and the ratio is
reported as not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import torch

from bertattn.bench import environment

from .corpus import stdlib_docstring_corpus
from .heads import TARGET, _reranker
from .serve import Server, _free_port, _start, start_infinity
from .serve_group import _pct, closed_loop

DOCS = 20


def start_bertattn(folder: str, threads: int | None) -> Server:
    port = _free_port()
    cmd = [sys.executable, "-m", "bertattn", "serve", "--model", folder, "--port", str(port)]
    cmd += ["-q"] + (["--threads", str(threads)] if threads else [])
    base = f"http://127.0.0.1:{port}"
    return _start("bertattn", cmd, base, "/v1/rerank", "/ready", Path(folder).name)


def _level(server: Server, bodies: list[bytes], clients: int, seconds: float) -> dict:
    return closed_loop({"lat": (server.url, bodies, clients)}, seconds)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    venv = os.environ.get("BERTATTN_BENCH_INFINITY")
    env = environment()
    print(
        f"# {env.get('processor')}, {env.get('cpu_capability')}, {env.get('cpus')} cores, "
        f"torch {torch.__version__}, fp32; {DOCS} passages per request"
    )
    texts = stdlib_docstring_corpus(400)
    queries = [" ".join(t.split()[:8]) for t in texts[:200]]
    passages = [" ".join(t.split()[:120]) for t in texts[200:400]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(_reranker(Path(tmp) / "reranker"))
        servers = {"bertattn": start_bertattn(folder, args.threads)}
        if venv:
            servers["infinity"] = start_infinity(venv, folder, "/rerank")
        results: dict[tuple[str, int], list[dict]] = {}
        try:
            for server in servers.values():  # a check of the answers' shape, then a warm-up
                body = {"model": server.model, "query": queries[0], "documents": passages[:DOCS]}
                r = httpx.post(server.url, json=body, timeout=120)
                if r.status_code != 200 or len(r.json().get("results", [])) != DOCS:
                    raise SystemExit(f"{server.name}: {r.status_code} {r.text[:300]}")
                _level(server, [json.dumps(body).encode()], 1, 2.0)
            for r in range(args.rounds):
                for c in levels:
                    order = list(servers) if (r + c) % 2 == 0 else list(servers)[::-1]
                    for name in order:
                        server = servers[name]
                        bodies = [
                            json.dumps(
                                {
                                    "model": server.model,
                                    "query": q,
                                    "documents": passages[i % 180 : i % 180 + DOCS],
                                }
                            ).encode()
                            for i, q in enumerate(queries)
                        ]
                        results.setdefault((name, c), []).append(
                            _level(server, bodies, c, args.seconds)
                        )
        finally:
            for server in servers.values():
                server.stop()
    print("| clients | server | pairs/s | p50 / p95 ms | errors |")
    print("|---|---|---|---|---|")
    best: dict[str, float] = {}
    for c in levels:
        for name in servers:
            runs = results[(name, c)]
            rate = statistics.median(DOCS * len(x["lat"]) / x["seconds"] for x in runs)
            best[name] = max(best.get(name, 0.0), rate)
            lat = [v for x in runs for v in x["lat"]]
            bad = sum(len(x["bad"]) for x in runs)
            ms = f"{1e3 * _pct(lat, 0.5):.0f} / {1e3 * _pct(lat, 0.95):.0f}"
            print(f"| {c} | {name} | {rate:.0f} | {ms} | {bad} |")
    if "infinity" in best:
        ratio = best["bertattn"] / best["infinity"]
        verdict = "met" if ratio >= TARGET else "not met"
        print(
            f"rerank over HTTP, best level each: {ratio:.2f}x infinity (target {TARGET:g}x: ",
            end="",
        )
        print(f"{verdict})")
    else:
        print("rerank over HTTP vs infinity: not measured (set BERTATTN_BENCH_INFINITY)")


if __name__ == "__main__":
    main()
