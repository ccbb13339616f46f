"""How long the server's event loop and tokenizer are held by one hostile request: ``/live``'s
longest wait while a body of 8M token ids (16 MB, the default body limit) is parsed and
checked, and a 3-word ``/tokenize``'s longest wait while ~14 MB of text is tokenized, each
against the same probe sent to the idle server. A real ``bertattn serve`` subprocess on
127.0.0.1.

    python -m benchmarks.serve_stalls [--model FOLDER] [--threads N] [--tries 3]

The numbers are timings: measure on a quiet machine. The tests check the mechanisms (which
thread parses and checks a large body; a small request finishing while a large one is still
tokenizing), not these times.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time

import httpx
import torch

from .serve import _default_model, start_bertattn


def _probe(
    url: str, method: str, path: str, body: dict | None, until: threading.Event
) -> list[float]:
    """Latencies of ``path``, one after another (a fresh connection each), until ``until`` is
    set (at most 120 s)."""
    out: list[float] = []
    stop = time.monotonic() + 120
    with httpx.Client(timeout=60) as c:
        while not until.is_set() and time.monotonic() < stop:
            t0 = time.perf_counter()
            c.request(method, url + path, json=body, headers={"connection": "close"})
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)
    return out


def _during(
    url: str, method: str, path: str, probe: dict | None, big: bytes
) -> tuple[float, float]:
    """``(longest probe wait, the large request's own time)`` while ``big`` is posted."""
    done, got = threading.Event(), {}
    t = threading.Thread(target=lambda: got.update(v=_probe(url, method, path, probe, done)))
    t.start()
    time.sleep(0.2)
    t0 = time.perf_counter()
    headers = {"content-type": "application/json"}
    httpx.post(url + "/v1/embeddings", content=big, headers=headers, timeout=300)
    took = time.perf_counter() - t0
    done.set()
    t.join()
    return max(got["v"]), took


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(_default_model()))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args(argv)
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {cpu}")
    row = "[" + ",".join(["5"] * 8000) + "]"
    ids = f'{{"model": "bench", "input": [{",".join([row] * 1000)}]}}'.encode()
    texts = [f"the attention head looks at token {i} " * 200 for i in range(1900)]
    text = json.dumps({"model": "bench", "input": texts}).encode()
    small = {"inputs": "three small words"}
    server = start_bertattn(args.model, args.threads)
    base = server.url.removesuffix("/v1/embeddings")
    try:
        cases = [
            ("/live during 8M token ids", "GET", "/live", None, ids),
            ("/tokenize during 14 MB of text", "POST", "/tokenize", small, text),
        ]
        print("| probe | idle (s) | longest wait, best of tries (s) | large request (s) |")
        print("|---|---|---|---|")
        for label, method, path, probe, big in cases:
            idle_done = threading.Event()
            timer = threading.Timer(1.0, idle_done.set)
            timer.start()
            idle = max(_probe(base, method, path, probe, idle_done))
            runs = [_during(base, method, path, probe, big) for _ in range(args.tries)]
            wait, took = min(runs)
            print(f"| {label} | {idle:.3f} | {wait:.3f} | {took:.2f} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
