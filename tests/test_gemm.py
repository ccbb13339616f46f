"""The library for float32 CPU products (bertattn.attention.gemm): oneDNN only where it agrees
with F.linear and was timed faster (or is asked for), never with an autograd graph to build,
the model's outputs unchanged either way, and explain() saying which ran and why."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
import transformers

import bertattn
from bertattn import BertModel
from bertattn.attention import fused, gemm


@pytest.fixture
def fresh(monkeypatch):
    """A process-wide choice made again in this test, and again after it (the next test's
    products time it afresh rather than inherit a forced one)."""
    monkeypatch.delenv(gemm.ENV, raising=False)
    gemm.reset()
    yield monkeypatch
    gemm.reset()


class _Calls:
    """Counts the products that went to oneDNN, and the element-wise steps fused into them."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        self.attrs: list[str] = []
        real = gemm._onednn

        def counted(x, w, b, attr="none", algorithm=""):
            self.count += 1
            self.attrs.append(attr)
            return real(x, w, b, attr, algorithm)

        monkeypatch.setattr(gemm, "_onednn", counted)


needs_onednn = pytest.mark.skipif(
    gemm._onednn_op() is None or not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN linear",
)


@needs_onednn
@pytest.mark.parametrize("asked", ["onednn", "mkl"])
def test_the_model_matches_transformers_on_either_library(fresh, tiny_checkpoint, asked):
    fresh.setenv(gemm.ENV, asked)
    gemm.choice()  # (its check of oneDNN against F.linear is not a product of the model)
    calls = _Calls(fresh)
    hf = transformers.BertModel.from_pretrained(tiny_checkpoint).eval()
    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 99, (3, 64), generator=g)  # 170 real tokens: >= MIN_ROWS rows
    mask = torch.ones_like(ids)
    mask[1, 42:] = 0
    with torch.inference_mode(), bertattn.explain() as log:
        out = model(ids * mask, mask)
        model(ids * mask, mask)
    with torch.inference_mode():
        ref = hf(ids * mask, mask)
    real = mask.bool()
    torch.testing.assert_close(
        out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    assert gemm.choice() == asked
    assert (calls.count > 0) == (asked == "onednn")
    # the feed-forward's bias and GELU inside oneDNN's product only where it computes them
    assert (calls.attrs.count("gelu") > 0) == (asked == "onednn"), calls.attrs
    said = [n for n in log.notes if n.startswith("float32 CPU products:")]
    assert said == [f"float32 CPU products: {asked} ({gemm.ENV}={asked})"]  # once a block


@needs_onednn
@pytest.mark.parametrize(
    ("vendor", "flags", "expected", "said"),
    [
        ("AuthenticAMD", {"avx2", "avx512f", "avx512bw"}, "onednn", "an AMD CPU with AVX-512"),
        ("AuthenticAMD", {"avx2", "fma"}, "mkl", "AuthenticAMD without AVX-512: MKL"),
        ("GenuineIntel", {"avx2", "avx512f", "amx_bf16"}, "mkl", "GenuineIntel with AVX-512: MKL"),
        ("", set(), "mkl", "an unknown vendor without AVX-512: MKL"),  # no /proc/cpuinfo
    ],
)
def test_auto_chooses_from_the_cpu_without_timing(fresh, vendor, flags, expected, said):
    """With the probes off (as in this suite) the CPU's rule: the same choice in every process
    on a machine, whatever its load, and nothing is timed."""
    fresh.setattr(gemm, "cpu_vendor", lambda: vendor)
    fresh.setattr(gemm, "cpu_flags", lambda: set(flags))
    fresh.setattr(gemm, "cpu_family", lambda: 26)  # not a Zen 4 (which has its own rule)

    def no_timing(fn):
        raise AssertionError("auto timed the libraries")

    fresh.setattr(gemm, "_best", no_timing)
    assert gemm.choice() == expected
    assert said in gemm.describe()


@needs_onednn
@pytest.mark.parametrize(("family", "expected"), [(25, "mkl"), (26, "onednn"), (None, "onednn")])
def test_an_amd_zen_4_keeps_mkl_by_its_rule(fresh, family, expected):
    """Zen 4 (family 25 with AVX-512) runs AVX-512 on 256-bit units: its rule is MKL for every
    class; another AMD CPU with AVX-512, or one whose family cannot be read, keeps oneDNN for
    small and batch products."""
    fresh.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    fresh.setattr(gemm, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    fresh.setattr(gemm, "cpu_family", lambda: family)
    fresh.setattr(gemm, "_disagreement", lambda: "")
    assert gemm.choices()["large"] == expected
    if family == 25:
        assert gemm.choices() == dict.fromkeys(gemm.CLASSES, "mkl")
        assert "an AMD Zen 4 CPU (family 25 with AVX-512)" in gemm.describe()


@pytest.mark.parametrize("asked", ["auto", "mkl"])
def test_onednn_is_not_even_checked_where_it_cannot_be_chosen(fresh, asked):
    fresh.setenv(gemm.ENV, asked)
    fresh.setattr(gemm, "cpu_vendor", lambda: "GenuineIntel")
    fresh.setattr(gemm, "cpu_flags", lambda: {"avx512f"})

    def no_check():
        raise AssertionError("oneDNN was checked although MKL was the only choice")

    fresh.setattr(gemm, "_disagreement", no_check)
    assert gemm.choice() == "mkl"


@needs_onednn
def test_timed_choice_takes_onednn_only_from_the_margin(fresh):
    fresh.setenv(gemm.ENV, "timed")
    for mkl_s, dnn_s, expected in ((2.0, 1.0, "onednn"), (1.1, 1.0, "mkl")):
        gemm.reset()
        times = iter([mkl_s, dnn_s])
        fresh.setattr(gemm, "_best", lambda fn, t=times: next(t))
        assert gemm.choice() == expected
        line = gemm.describe()
        assert f"BERTATTN_CPU_GEMM=timed: measured oneDNN {mkl_s / dnn_s:.2f}x MKL" in line, line
        assert ("from 1.15x" in line) == (expected == "mkl"), line


@needs_onednn
def test_an_amd_cpu_with_avx512_still_checks_onednn_first(fresh):
    fresh.setattr(gemm, "cpu_vendor", lambda: "AuthenticAMD")
    fresh.setattr(gemm, "cpu_flags", lambda: {"avx512f"})
    fresh.setattr(gemm, "cpu_family", lambda: 26)
    fresh.setattr(gemm, "_onednn", lambda x, w, b: F.linear(x, w, b) * 1.01)
    assert gemm.choice() == "mkl"
    assert "disagreed" in gemm.describe()


@needs_onednn
def test_onednn_that_disagrees_is_never_used(fresh):
    fresh.setenv(gemm.ENV, "onednn")
    fresh.setattr(gemm, "_onednn", lambda x, w, b: F.linear(x, w, b) + 1e-3)
    assert gemm.choice() == "mkl"
    assert "disagreed" in gemm.describe()
    x, w = torch.randn(4, 8), torch.randn(5, 8)
    torch.testing.assert_close(gemm.linear(x, w, None), F.linear(x, w, None), atol=0, rtol=0)


@needs_onednn
def test_no_onednn_where_autograd_or_other_dtypes_need_the_plain_op(fresh):
    fresh.setenv(gemm.ENV, "onednn")
    assert gemm.choice() == "onednn"
    calls = _Calls(fresh)
    lin = torch.nn.Linear(8, 6)
    x = torch.randn(gemm.MIN_ROWS, 8)
    y = gemm.linear(x, lin.weight, lin.bias)  # a graph to build: the weight requires grad
    y.sum().backward()
    assert lin.weight.grad is not None and calls.count == 0
    gemm.linear(x.double(), lin.weight.double(), lin.bias.double())
    gemm.linear(x.t().contiguous().t(), lin.weight, lin.bias)  # a transposed (strided) input
    assert calls.count == 0
    with torch.no_grad():
        got = gemm.linear(x, lin.weight, lin.bias)
    assert calls.count == 1
    torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), atol=1e-6, rtol=1e-6)


@needs_onednn
def test_a_short_product_is_padded_to_a_kernel_it_shares(fresh):
    """Below MIN_ROWS the rows are padded with zeros to a multiple of SMALL_ROWS (one kernel
    for many token counts); the caller gets its own rows, equal to F.linear's up to rounding,
    in its own shape, and the padded rows never leak (NaN in the buffer would not matter)."""
    fresh.setenv(gemm.ENV, "onednn")
    seen = []
    real = gemm._onednn_op()
    fresh.setattr(gemm, "_onednn_op", lambda: lambda x, *a: seen.append(x.shape[0]) or real(x, *a))
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    with torch.no_grad():
        for shape in ((1, 16), (3, 11, 16), (gemm.SMALL_ROWS, 16), (2, 50, 16), (130, 16)):
            x = torch.randn(*shape, generator=g)
            got = gemm.linear(x, w, b)
            assert got.shape == (*shape[:-1], 24) and got.is_contiguous()
            torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
            gelu = fused.linear_gelu(x, w, b)
            torch.testing.assert_close(gelu, F.gelu(F.linear(x, w, b)), atol=1e-5, rtol=1e-5)
    # (the first product is the choice's own check of oneDNN against F.linear)
    assert seen[1:] == [32, 32, 64, 64, 32, 32, 128, 128, 130, 130], seen


def test_a_bad_setting_says_what_it_takes(fresh):
    fresh.setenv(gemm.ENV, "blas")
    with pytest.raises(
        ValueError, match=r"BERTATTN_CPU_GEMM='blas' is not one of auto, rule, mkl, onednn, timed"
    ):
        gemm.choice()


def test_onednn_kernel_caches_are_capped_unless_set(tmp_path):
    """Each product shape keeps a kernel in oneDNN's caches; with a row count that changes
    every batch, their default of 1,024 each grew a process by gigabytes."""
    import subprocess
    import sys

    names = "'ONEDNN_PRIMITIVE_CACHE_CAPACITY', 'LRU_CACHE_CAPACITY'"
    code = f"import os, bertattn.attention; print(*(os.environ[k] for k in ({names})))"
    env = {k: v for k, v in os.environ.items() if not k.endswith("CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == [str(gemm.CACHE_CAPACITY)] * 2, out.stderr
    env["LRU_CACHE_CAPACITY"] = "7"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == [str(gemm.CACHE_CAPACITY), "7"], out.stderr
