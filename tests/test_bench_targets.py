"""The speed targets `make bench` reports (benchmarks/run.py, benchmarks/overhead.py): each
verdict follows from the measured ratios, the worst case decides, and a bf16 target is not
judged on a CPU that emulates bf16."""

from __future__ import annotations

import pytest

from benchmarks.overhead import targets as overhead_targets
from benchmarks.run import MODULE_TARGETS, format_module_targets, module_targets


def _case(batch: int, length: int, dtype: str, **speedup: float) -> dict:
    return {"batch": batch, "seq_len": length, "dtype": dtype, "speedup_vs": speedup}


def _results(fp32_hf: tuple[float, float], bf16: dict[str, tuple[float, float]]) -> list[dict]:
    return [
        _case(8, 128, "float32", hf_sdpa=fp32_hf[0], article=1.1, torch_mha=1.0),
        _case(8, 512, "float32", hf_sdpa=fp32_hf[1], article=1.9, torch_mha=1.4),
        _case(8, 128, "bfloat16", **{p: r[0] for p, r in bf16.items()}),
        _case(8, 512, "bfloat16", **{p: r[1] for p, r in bf16.items()}),
    ]


def _status(rows: list[dict], dtype: str, peer: str) -> str:
    (row,) = [r for r in rows if r["dtype"] == dtype and r["peer"] == peer]
    return str(row["status"])


def test_every_target_is_reported() -> None:
    rows = module_targets(
        _results((1.02, 1.01), {"article": (1.2, 1.3), "torch_mha": (1.2, 1.2)}), "native"
    )
    assert [(r["dtype"], r["peer"], r["need"]) for r in rows] == list(MODULE_TARGETS)
    assert {r["status"] for r in rows} == {"met"}


def test_the_worst_case_decides() -> None:
    rows = module_targets(
        _results((1.05, 0.97), {"article": (1.3, 1.1), "torch_mha": (1.2, 1.3)}), "native"
    )
    assert _status(rows, "float32", "hf_sdpa") == "not met"  # 0.97x at B=8 L=512
    assert _status(rows, "bfloat16", "article") == "not met"  # 1.1x < 1.15x
    assert _status(rows, "bfloat16", "torch_mha") == "met"
    fp32 = [r for r in rows if r["dtype"] == "float32"][0]
    assert fp32["ratios"] == {"B=8 L=128": 1.05, "B=8 L=512": 0.97}


@pytest.mark.parametrize("bf16_matmul", ["emulated", "unknown"])
def test_bf16_targets_are_not_judged_when_emulated(bf16_matmul: str) -> None:
    rows = module_targets(
        _results((1.0, 1.0), {"article": (2.0, 2.0), "torch_mha": (2.0, 2.0)}), bf16_matmul
    )
    assert _status(rows, "bfloat16", "article").startswith("not measurable")
    assert _status(rows, "float32", "hf_sdpa") == "met"  # 1.0x is enough
    text = format_module_targets(rows)
    assert "bfloat16 vs article >= 1.15x: B=8 L=128 2.00x, B=8 L=512 2.00x: not measurable" in text


def test_a_missing_peer_is_said_not_measured() -> None:
    rows = module_targets([_case(8, 128, "float32", article=1.1)], "native")
    assert _status(rows, "float32", "hf_sdpa").startswith("not measured")
    assert _status(rows, "bfloat16", "torch_mha").startswith("not measured")


def test_overhead_targets_carry_the_floor() -> None:
    times = {
        "tiny": {"bertattn": 40e-6, "torch MHA": 50e-6, "kernels only": 30e-6},
        "MiniLM one query": {
            "bertattn": 7.6e-3,
            "transformers sdpa": 10e-3,
            "bare tensor ops": 6.4e-3,
        },
    }
    rows = {r["case"]: r for r in overhead_targets(times)}
    assert rows["tiny"]["status"] == "met" and rows["tiny"]["floor_ratio"] == pytest.approx(0.6)
    assert rows["MiniLM one query"]["status"] == "not met"
    assert rows["MiniLM one query"]["floor_ratio"] == pytest.approx(0.64)
    assert rows["tiny + key_padding_mask"]["status"].startswith("not measured")


@pytest.mark.parametrize(
    ("bf16_matmul", "status"), [("native", "met"), ("emulated", "not judged (bf16 emulated")]
)
def test_the_bf16_one_query_is_judged_only_where_bf16_is_native(bf16_matmul, status) -> None:
    from benchmarks.overhead import BF16_CASE, HF_FP32

    times = {BF16_CASE: {"bertattn": 3.0e-3, "transformers sdpa": 5.0e-3, HF_FP32: 9.0e-3}}
    (row,) = [r for r in overhead_targets(times, bf16_matmul) if r["case"] == BF16_CASE]
    # judged against transformers in the same precision, never against its float32 forward
    assert row["peer"] == "transformers sdpa" and row["ratio"] == pytest.approx(0.6)
    assert row["ratio_before"] is None and str(row["status"]).startswith(status)


@pytest.mark.parametrize(("seconds", "verdict"), [(0.4, "met"), (95.0, "not met")])
def test_an_int8_refusal_is_judged_by_how_long_it_took(capsys, seconds, verdict) -> None:
    from benchmarks.int8 import print_refusal

    print_refusal(ValueError("int8 is refused on this CPU (X): 0.002x"), seconds)
    out = capsys.readouterr().out
    assert f"int8 refused after {seconds:.1f} s: int8 is refused on this CPU (X)" in out
    assert f"a refusal within 10 s where int8 is slower: {seconds:.1f} s: {verdict}\n" in out
    assert "int8 >= 1.8x float32: not measurable (int8 refused on this CPU)" in out


def test_the_torchao_benchmark_says_torchao_is_missing_and_goes_on(capsys, monkeypatch) -> None:
    import sys

    from benchmarks.int8_torchao import load_torchao

    monkeypatch.setitem(sys.modules, "torchao", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    assert load_torchao() is None
    assert capsys.readouterr().out == "torchao: not installed (pip install torchao), not measured\n"


def _quiet(rates: dict[str, dict[str, float]], cosines: dict[str, float]) -> dict:
    corpora: dict[str, dict] = {corpus: {"texts_per_s": r} for corpus, r in rates.items()}
    for corpus, cos in cosines.items():
        corpora[corpus]["bf16_min_cosine"] = cos
    return {"quiet": {"corpora": corpora}}


def test_native_bf16_targets_follow_the_ratios_and_the_cosines() -> None:
    from benchmarks.shared import _native_bf16_verdicts

    results = _quiet(
        {
            "paragraphs": {"bertattn bf16": 45.0, "openvino bf16": 49.0},
            "short": {"bertattn bf16": 600.0, "openvino bf16": 400.0},
        },
        {"paragraphs": 0.99998, "short": 0.9998},
    )
    verdicts = dict(_native_bf16_verdicts(results, native=True))
    assert verdicts["quiet: bertattn bf16 paragraphs >= 1.2x openvino bf16"] == "0.92x: not met"
    assert verdicts["quiet: bertattn bf16 short >= 1.5x openvino bf16"] == "1.50x: met"
    assert verdicts["quiet: bertattn bf16 paragraphs min cosine vs fp32 >= 0.9999"] == (
        "0.999980: met"
    )
    short_cosine = verdicts["quiet: bertattn bf16 short min cosine vs fp32 >= 0.9999"]
    assert short_cosine == "0.999800: not met"


def test_native_bf16_targets_are_not_judged_when_emulated_or_missing() -> None:
    from benchmarks.shared import _native_bf16_verdicts

    results = _quiet({"paragraphs": {"bertattn fp32": 20.0}, "short": {"bertattn fp32": 300.0}}, {})
    emulated = dict(_native_bf16_verdicts(results, native=False))
    assert set(emulated.values()) == {"not measurable (bf16 emulated on this CPU)"}
    missing = dict(_native_bf16_verdicts(results, native=True))
    assert missing["quiet: bertattn bf16 short >= 1.5x openvino bf16"] == (
        "not measurable (peer missing)"
    )


def test_min_cosine_is_the_least_row_cosine() -> None:
    from benchmarks.shared import min_cosine

    a = [[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]
    b = [[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    assert min_cosine(a, b) == pytest.approx(2**-0.5)
