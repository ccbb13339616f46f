"""The float32 product library per shape class (bertattn.attention.gemm): timed once per
machine and thread count, kept in the probe cache, so the same choice in every later process;
injected timings decide; a timing disturbed by other processes is not kept; the CPU's rule
where the probes are off; each class's products go where its choice says."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from bertattn.attention import gemm
from bertattn.runtime import probe

needs_onednn = pytest.mark.skipif(
    gemm._onednn_op() is None or not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN linear",
)


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """Probes on, a cache folder of the test's own, the choice made afresh; ``timed.ratios``
    is what the injected timing answers (oneDNN's speed over MKL's per class), and
    ``timed.calls`` how often it was asked."""

    class Timed:
        ratios = {"tiny": 0.5, "small": 2.0, "large": 1.0}
        calls = 0

    state = Timed()

    def fake():
        state.calls += 1
        return {"ratios": dict(state.ratios), "date": "2026-12-04"}

    monkeypatch.delenv(gemm.ENV, raising=False)
    monkeypatch.setenv(probe.PROBE_ENV, "1")
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path))
    monkeypatch.setattr(gemm, "_time_classes", fake)
    gemm.reset()
    yield state
    gemm.reset()


def test_shape_classes():
    assert gemm.shape_class(16, 64, 192) == "tiny"  # a width-64 module on 16 tokens
    assert gemm.shape_class(9, 384, 1152) == "small"  # one MiniLM query
    assert gemm.shape_class(gemm.MIN_ROWS, 384, 1536) == "large"
    assert gemm.shape_class(gemm.MIN_ROWS - 1, 384, 1536) == "small"


@needs_onednn
def test_injected_timings_decide_each_class_and_are_kept(timed):
    assert gemm.choices() == {"tiny": "mkl", "small": "onednn", "large": "mkl"}
    assert gemm.choice() == "mkl"  # the batch class's
    line = gemm.describe()
    assert "tiny 0.50x, small 2.00x, large 1.00x; oneDNN from 1.15x" in line, line
    assert "tiny mkl, small onednn, large mkl" in line, line
    assert timed.calls == 1
    entries = json.loads(gemm.cache_path().read_text())["entries"]
    (key,) = [k for k in entries if k.startswith("cpu-gemm")]
    assert f"| {torch.get_num_threads()} threads |" in key
    # another process (here: the choice forgotten) reads the cache and does not time again,
    # even where a new timing would answer otherwise: one answer for a given cache
    timed.ratios = {"tiny": 9.0, "small": 0.1, "large": 9.0}
    gemm.reset()
    assert gemm.choices() == {"tiny": "mkl", "small": "onednn", "large": "mkl"}
    assert timed.calls == 1
    assert "(timed 2026-12-04" in gemm.describe()


@needs_onednn
def test_a_tie_within_the_margin_keeps_mkl(timed):
    timed.ratios = {"tiny": 1.14, "small": 1.15, "large": 1.0}
    assert gemm.choices() == {"tiny": "mkl", "small": "onednn", "large": "mkl"}


@needs_onednn
def test_each_class_goes_to_its_library(timed, monkeypatch):
    seen: list[int] = []
    real = gemm._onednn
    monkeypatch.setattr(
        gemm, "_onednn", lambda x, w, b, *a: seen.append(x.shape[0]) or real(x, w, b, *a)
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for rows, k, n in ((16, 64, 192), (9, 384, 1152), (300, 384, 384)):
            x, w, b = (
                torch.randn(rows, k, generator=g),
                torch.randn(n, k, generator=g),
                torch.randn(n, generator=g),
            )
            got = gemm.linear(x, w, b)
            want = F.linear(x.double(), w.double(), b.double())
            assert (got.double() - want).abs().max() < 1e-3
    assert seen[1:] == [9], seen  # the small product alone (after the check of oneDNN)


@needs_onednn
def test_a_disturbed_timing_is_not_kept_and_the_rule_decides(timed, monkeypatch):
    def busy():
        timed.calls += 1
        raise gemm.Disturbed("the timing waited 60% of its time for a CPU")

    monkeypatch.setattr(gemm, "_time_classes", busy)
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: {"avx512f"})
    monkeypatch.setattr(gemm, "cpu_family", lambda: 26)
    assert gemm.choices() == {"tiny": "mkl", "small": "onednn", "large": "onednn"}
    assert "not timed: the timing waited 60%" in gemm.describe()
    assert not gemm.cache_path().exists() or "cpu-gemm" not in gemm.cache_path().read_text()


def test_decided_inside_the_dtype_probe_without_deadlock(monkeypatch, tmp_path):
    """The dtype probe times float32 products through gemm.linear while it holds the probe
    cache's locks: the first of them decides the library, with a cache of its own."""
    from bertattn.encoder import auto_dtype

    monkeypatch.delenv(gemm.ENV, raising=False)
    monkeypatch.setenv(probe.PROBE_ENV, "1")
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path))
    monkeypatch.setattr(
        gemm, "_time_classes", lambda: {"ratios": dict.fromkeys(gemm.CLASSES, 1.0), "date": "d"}
    )
    monkeypatch.setattr(auto_dtype, "PROBE_BUDGET_S", 0.0)

    class Quiet:  # a CPU no other process takes: the timing is kept whatever this one does
        def total(self) -> int:
            return 0

    monkeypatch.setattr(auto_dtype, "RunDelay", Quiet)
    gemm.reset()
    auto_dtype.reset()
    try:
        choice = auto_dtype.probe_dtype(widths=(16, 32), rows=8)
    finally:
        gemm.reset()
        auto_dtype.reset()
    assert choice.dtype in (torch.float32, torch.bfloat16)
    assert gemm.cache_path().exists() and probe.cache_path().exists()
    assert gemm.cache_path() != probe.cache_path()


def test_the_wait_share_is_measured(monkeypatch):
    """The real timing reads the run-queue delay of its threads around the rounds; a delay
    beyond MAX_WAIT_SHARE raises Disturbed (here one injected reading of 100 s waited)."""
    from bertattn.runtime import threads

    readings = iter([0, 100 * 10**9])
    monkeypatch.setattr(threads.RunDelay, "total", lambda self: next(readings))
    monkeypatch.setattr(gemm, "CLASS_SHAPES", {c: (2, 4, 4) for c in gemm.CLASSES})
    if gemm._onednn_op() is None:
        pytest.skip("no oneDNN linear")
    with pytest.raises(gemm.Disturbed, match="waited"):
        gemm._time_classes()


def test_probes_off_means_the_rule_without_timing(timed, monkeypatch):
    monkeypatch.setenv(probe.PROBE_ENV, "0")
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: {"avx512f"})
    assert gemm.choices() == dict.fromkeys(gemm.CLASSES, "mkl")
    assert timed.calls == 0
    assert f"(not timed: {probe.PROBE_ENV}=0)" in gemm.describe()


@needs_onednn
def test_rule_and_forced_settings_do_not_time(timed, monkeypatch):
    monkeypatch.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: {"avx512f"})
    monkeypatch.setattr(gemm, "cpu_family", lambda: 26)
    for asked, want in (
        ("rule", {"tiny": "mkl", "small": "onednn", "large": "onednn"}),
        ("onednn", dict.fromkeys(gemm.CLASSES, "onednn")),
        ("mkl", dict.fromkeys(gemm.CLASSES, "mkl")),
    ):
        monkeypatch.setenv(gemm.ENV, asked)
        gemm.reset()
        assert gemm.choices() == want, asked
    assert timed.calls == 0


@needs_onednn
def test_a_bad_cache_entry_is_named(timed):
    gemm.choices()
    path = gemm.cache_path()
    data = json.loads(path.read_text())
    for key in data["entries"]:
        data["entries"][key] = {"ratios": "?"}
    path.write_text(json.dumps(data))
    gemm.reset()
    gemm.choices()  # the rule decides, and the reason names the file
    assert "holds a bad entry" in gemm.describe() and str(path) in gemm.describe()
