"""Two models in one ``bertattn serve`` (an embedder and a reranker, ``--model`` twice): a
worker per model (the default) against ``--one-worker`` (their batches one at a time), under
the same mixed load, in one run.

    python -m benchmarks.serve_group [--seconds 15] [--rounds 2] [--clients 4,4] [--threads N]

The embedder is all-MiniLM-L6-v2; the reranker its encoder with a seeded one-label head (the
shape of ``cross-encoder/ms-marco-MiniLM-L6-v2``, whose weights are not installable here: the
work per pair is the same). Load: closed-loop clients, ``E`` sending one short query to
``/v1/embeddings`` at a time and ``R`` sending a query with 20 passages to ``/v1/rerank``,
for ``--seconds``; the two servers alternate round by round. Reported per server: embedding
requests/s and rerank requests/s (medians over rounds), each route's latency p50 / p95, and
errors. The machine's cores are shared with the load generator: read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bertattn.bench import environment

from .corpus import stdlib_docstring_corpus
from .heads import _reranker
from .http_load import Connection
from .serve import Server, _default_model, _free_port, _start


def start(models: list[str], one_worker: bool, threads: int | None) -> Server:
    port = _free_port()
    cmd = [sys.executable, "-m", "bertattn", "serve", "--port", str(port), "-q"]
    for m in models:
        cmd += ["--model", m]
    if one_worker:
        cmd.append("--one-worker")
    if threads:
        cmd += ["--threads", str(threads)]
    base = f"http://127.0.0.1:{port}"
    name = "one worker" if one_worker else "a worker per model"
    return _start(name, cmd, base, "", "/ready", "")


async def _client(url: str, bodies: list[bytes], until: float, lat: list[float], bad: list[int]):  # type: ignore[no-untyped-def]
    conn = Connection(url)
    i = 0
    try:
        while time.monotonic() < until:
            t0 = time.perf_counter()
            r = await conn.post(bodies[i % len(bodies)])
            (lat if r.status == 200 else bad).append(
                time.perf_counter() - t0 if r.status == 200 else r.status
            )
            i += 1
    finally:
        conn.close()


def closed_loop(groups: dict[str, tuple[str, list[bytes], int]], seconds: float) -> dict:
    """Closed-loop clients for ``seconds``: per group ``name -> (url, bodies, clients)``, that
    many clients each posting the bodies in turn. ``{name: latencies of its 200s, ..., "bad":
    the other statuses, "seconds": the wall time}``."""

    async def go() -> dict:
        until = time.monotonic() + seconds
        out: dict = {name: [] for name in groups}
        out["bad"] = []
        tasks = [
            _client(url, bodies, until, out[name], out["bad"])
            for name, (url, bodies, clients) in groups.items()
            for _ in range(clients)
        ]
        t0 = time.perf_counter()
        await asyncio.gather(*tasks)
        out["seconds"] = time.perf_counter() - t0
        return out

    return asyncio.run(go())


def _round(
    server: Server,
    embed: list[bytes],
    rerank: list[bytes],
    clients: tuple[int, int],
    seconds: float,
) -> dict:
    groups = {
        "embed": (server.url + "/v1/embeddings", embed, clients[0]),
        "rerank": (server.url + "/v1/rerank", rerank, clients[1]),
    }
    return closed_loop(groups, seconds)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", default="4,4", help="embedding clients,rerank clients")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    clients = tuple(int(x) for x in args.clients.split(","))
    env = environment()
    print(
        f"# CPU {env.get('cpu_capability') or torch.backends.cpu.get_cpu_capability()}, "
        f"{env.get('cpus', '?')} cores, torch {torch.__version__}, fp32, clients {clients}"
    )
    texts = stdlib_docstring_corpus(400)
    queries = [" ".join(t.split()[:8]) for t in texts[:200]]
    passages = [" ".join(t.split()[:120]) for t in texts[200:400]]
    with tempfile.TemporaryDirectory() as tmp:
        embedder = str(_default_model())
        reranker = str(_reranker(Path(tmp) / "reranker"))
        names = [Path(embedder).name, Path(reranker).name]
        embed = [json.dumps({"model": names[0], "input": [q]}).encode() for q in queries]
        rerank = [
            json.dumps(
                {"model": names[1], "query": q, "documents": passages[i % 180 : i % 180 + 20]}
            ).encode()
            for i, q in enumerate(queries)
        ]
        results: dict[bool, list[dict]] = {False: [], True: []}
        for r in range(args.rounds):
            for one in (False, True) if r % 2 == 0 else (True, False):
                server = start([embedder, reranker], one, args.threads)
                try:
                    _round(server, embed[:8], rerank[:4], (1, 1), 2.0)  # warm-up
                    results[one].append(_round(server, embed, rerank, clients, args.seconds))
                finally:
                    server.stop()
    print("| server | embed req/s | rerank req/s | embed p50/p95 ms | rerank p50/p95 ms | errors |")
    print("|---|---|---|---|---|---|")
    for one in (False, True):
        runs = results[one]
        e = statistics.median(len(x["embed"]) / x["seconds"] for x in runs)
        rr = statistics.median(len(x["rerank"]) / x["seconds"] for x in runs)
        le = [v for x in runs for v in x["embed"]]
        lr = [v for x in runs for v in x["rerank"]]
        bad = sum(len(x["bad"]) for x in runs)
        name = "--one-worker" if one else "a worker per model"
        e_ms = f"{1e3 * _pct(le, 0.5):.1f} / {1e3 * _pct(le, 0.95):.1f}"
        r_ms = f"{1e3 * _pct(lr, 0.5):.1f} / {1e3 * _pct(lr, 0.95):.1f}"
        print(f"| {name} | {e:.1f} | {rr:.1f} | {e_ms} | {r_ms} | {bad} |")


if __name__ == "__main__":
    main()
