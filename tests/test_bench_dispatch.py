"""`bertattn bench --dispatch`, the table's regeneration (bench/dispatch.py, benchmarks/dispatch.py)
and the CPU capability every benchmark prints (bench/timing.py)."""

from __future__ import annotations

import pytest

from bertattn.attention import policy
from bertattn.bench import cpu_capability, environment
from bertattn.bench.dispatch import DispatchMeasurement, derive_table, format_measurement


def test_bench_dispatch_prints_the_table_in_use(cli) -> None:
    r = cli("bench", "--dispatch")
    assert r.code == 0, r
    assert "attention dispatch policy" in r.out
    cap = cpu_capability()
    assert f"cpu: {cap['capability']}, bf16 matmul {cap['bf16_matmul']}" in r.out  # in words
    assert "{'" not in r.out  # not the raw environment dict
    for rule in policy.TABLE:
        assert any(
            line.split()[:4] == [rule.device, rule.dtype, rule.size, rule.kernel]
            for line in r.out.splitlines()
        ), rule
    assert "H200" in r.out  # the CUDA row says where it was measured


def test_measure_needs_dispatch(cli) -> None:
    r = cli("bench", "--measure")
    assert r.code == 2 and "--measure goes with --dispatch" in r.err


def test_environment_names_the_cpu_capability() -> None:
    env = environment()
    assert env["cpu_capability"] in ("AMX", "AVX512_BF16", "AVX512", "AVX2", "default")
    assert env["bf16_matmul"] in ("native", "emulated")


@pytest.mark.parametrize(
    ("flags", "torch_cap", "level", "bf16"),
    [
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX512", "AMX", "native"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512", "AVX512_BF16", "native"),
        ({"avx2", "avx512f", "avx512bw"}, "AVX512", "AVX512", "emulated"),
        ({"avx2"}, "AVX2", "AVX2", "emulated"),
        (set(), "DEFAULT", "default", "emulated"),
        (set(), "AVX512", "AVX512", "emulated"),  # no /proc/cpuinfo: torch's word
    ],
)
def test_cpu_capability_levels(flags: set[str], torch_cap: str, level: str, bf16: str) -> None:
    cap = cpu_capability(flags, torch_cap)
    assert cap["capability"] == level and cap["bf16_matmul"] == bf16
    assert cap["torch_capability"] == torch_cap


def _measurement(math_over_sdpa: dict[str, float], speedups: list[float]) -> DispatchMeasurement:
    kernels = [
        {"size": s, "shape": (1, 12, 16, 32), "math_s": r, "sdpa_s": 1.0, "math_over_sdpa": r}
        for s, r in math_over_sdpa.items()
    ]
    varlen = [
        {
            "size": "short", "batch": 32, "seq_len": 128, "pad_fraction": p, "varlen_s": 1.0,
            "sdpa_s": s, "varlen_speedup": s,
        }
        for p, s in zip((0.05, 0.1, 0.2, 0.4), speedups, strict=True)
    ]
    env = {"processor": "test cpu", "cpu_capability": "AVX512", "bf16_matmul": "emulated",
           "threads": 2, "torch": "x"}
    return DispatchMeasurement(kernels, varlen, env)


def test_derive_table_follows_the_measurement() -> None:
    m = _measurement({"tiny": 0.8, "short": 0.95, "medium": 2.0, "long": 3.0},
                     [0.9, 1.01, 1.2, 1.5])
    table = derive_table(m)
    rows = {r.size: r for r in table if r.device == "cpu" and r.dtype == "float32"}
    assert rows["tiny"].kernel == "math"  # 20% faster
    assert rows["short"].kernel == "sdpa"  # 5% faster is within the margin
    assert rows["medium"].kernel == rows["long"].kernel == "sdpa"
    assert rows["short"].varlen_min_pad == 0.1  # packing pays from 10% on
    assert rows["tiny"].varlen_min_pad == policy.lookup("cpu", "float32", 8).varlen_min_pad
    assert "not measured for this class" in rows["tiny"].source
    assert "test cpu" in rows["short"].source
    # CUDA and the other-dtype rows are kept, CUDA first
    assert table[0] == policy.TABLE[0] and table[0].device == "cuda"
    assert table[-1] == policy.TABLE[-1]
    never = derive_table(_measurement({"short": 1.5}, [0.9, 1.1, 0.95, 1.3]))
    assert [r.varlen_min_pad for r in never if r.size == "short"] == [0.4]
    assert "math/sdpa" in format_measurement(m)


def test_table_source_round_trips_and_the_benchmark_writes_it(tmp_path) -> None:
    from benchmarks.dispatch import write_table

    table = derive_table(_measurement({"tiny": 0.5}, [1.0, 1.0, 1.0, 1.0]))
    ns: dict[str, object] = {"Rule": policy.Rule}
    exec(policy.table_source(table).replace("TABLE: tuple[Rule, ...]", "TABLE"), ns)
    assert ns["TABLE"] == table
    target = tmp_path / "policy.py"
    target.write_text(open(policy.__file__, encoding="utf-8").read(), encoding="utf-8")
    write_table(table, target)
    text = target.read_text(encoding="utf-8")
    assert "# BEGIN GENERATED TABLE" in text and "# END GENERATED TABLE" in text
    assert "'cpu', 'float32', 'tiny', 'math', 0.1," in text  # tiny: threshold kept
    compile(text, str(target), "exec")
