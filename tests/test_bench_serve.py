"""How `python -m benchmarks.serve` judges throughput: every level sends the same fixed order of
texts, and a level's speed is the in-process work it answered per second, so a level that drew
lighter texts is not counted faster (no server is started here)."""

from __future__ import annotations

import itertools

from benchmarks.serve import Ceiling, Level, Run, text_order, verdicts


def test_every_round_of_the_order_is_each_text_once() -> None:
    order = list(itertools.islice(text_order(7), 7 * 3))
    rounds = [order[i : i + 7] for i in range(0, len(order), 7)]
    assert all(sorted(r) == list(range(7)) for r in rounds)
    assert rounds[0] == rounds[1] == rounds[2]
    assert rounds[0] != list(range(7))  # shuffled
    assert list(itertools.islice(text_order(7), 7)) == rounds[0]  # the same for every level


def _level(concurrency: int, short: int, long: int, seconds: float = 10.0) -> Level:
    return Level(concurrency, seconds=seconds, ok=short + long, long=long)


def test_speed_counts_work_not_texts() -> None:
    short_s, long_s = 0.002, 0.040  # encode: 500 short texts/s, 25 paragraphs/s
    at_encode = _level(8, short=2500, long=125)  # 5 s + 5 s of encode's work in 10 s
    assert abs(at_encode.speed(short_s, long_s) - 1.0) < 1e-12
    lighter = _level(32, short=3000, long=90)  # 6 s + 3.6 s: more texts, less work
    assert lighter.ok > at_encode.ok
    assert abs(lighter.speed(short_s, long_s) - 0.96) < 1e-12
    run = Run([at_encode, lighter], _level(128, short=1000, long=50), query_s=0.01, rss=None)
    assert run.best(short_s, long_s) is at_encode


def _ceiling(short_s: float, long_s: float) -> Ceiling:
    return Ceiling(rates=[100.0], short_s=[short_s], long_s=[long_s], query_s=[0.010])


def test_the_saturation_verdict_reads_the_speed(capsys) -> None:  # type: ignore[no-untyped-def]
    ceiling = _ceiling(0.002, 0.040)
    over = _level(128, short=1000, long=50)  # 0.4x
    ours = Run([_level(32, short=3000, long=90)], over, query_s=0.0105, rss=None)  # 0.96x
    verdicts(ours, None, ceiling)
    out = capsys.readouterr().out
    assert "saturated >= 0.95x the in-process ceiling: met (0.960x at concurrency 32" in out
    more_texts = Run([_level(32, short=3200, long=72)], over, query_s=0.0105, rss=None)
    verdicts(more_texts, None, ceiling)  # 3,272 texts against 3,090, but 6.4 s + 2.88 s
    out = capsys.readouterr().out
    assert "saturated >= 0.95x the in-process ceiling: NOT met (0.928x at concurrency 32" in out
    peer = Run([_level(8, short=1500, long=125)], over, query_s=0.02, rss=None)  # 3 s + 5 s
    verdicts(ours, peer, ceiling)
    assert "saturated >= 2x infinity: NOT met (0.960 / 0.800 of in-process speed = 1.20x)" in (
        capsys.readouterr().out
    )


def test_a_machine_whose_speed_moved_is_not_judged(capsys) -> None:  # type: ignore[no-untyped-def]
    over = _level(128, short=1000, long=50)
    ours = Run([_level(32, short=3000, long=90)], over, query_s=0.0105, rss=None)
    peer = Run([_level(8, short=1500, long=125)], over, query_s=0.02, rss=None)
    steady = Ceiling([100.0], [100.0, 97.0], [0.002], [0.040], [0.010])  # 3% apart: judged
    verdicts(ours, peer, steady)
    assert "not judged" not in capsys.readouterr().out
    moved = Ceiling([100.0], [100.0, 75.0], [0.002], [0.040], [0.010])  # a busy host, then
    verdicts(ours, peer, moved)
    out = capsys.readouterr().out
    assert "Bert.encode ran 1.33x as fast in one measurement as in the other" in out
    for target in ("0.95x the in-process ceiling", "2x infinity", "1 ms + 10% of in-process"):
        assert f"{target}: not judged (" in out, target
    assert "4x overload: only 429s as errors: met" in out  # read off the server alone


def test_cpu_seconds_reads_a_process_and_its_main_thread() -> None:
    import os
    import time

    from benchmarks.serve import cpu_seconds

    pid = os.getpid()
    before, main_before = cpu_seconds(pid), cpu_seconds(pid, pid)
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this (main) thread's CPU
        pass
    after, main_after = cpu_seconds(pid), cpu_seconds(pid, pid)
    assert None not in (before, main_before, after, main_after)
    assert after - before >= 0.25 and main_after - main_before >= 0.25  # ticks: 10 ms apart
    assert cpu_seconds(pid, 2**31 - 1) is None  # no such thread: nothing made up


def test_the_saturation_verdict_names_the_event_loops_cpus(capsys) -> None:  # type: ignore[no-untyped-def]
    import os

    level = _level(32, short=3000, long=90)
    level.server_cpus, level.loop_cpus = 1.89, 0.07
    ours = Run([level], _level(128, short=1000, long=50), query_s=0.0105, rss=None)
    verdicts(ours, None, _ceiling(0.002, 0.040))
    cpus = len(os.sched_getaffinity(0))
    assert f"its event loop kept 0.07 of the {cpus} CPUs busy, the whole server 1.89)" in (
        capsys.readouterr().out
    )
    assert level.row().split()[-2:] == ["1.89", "0.07"]
