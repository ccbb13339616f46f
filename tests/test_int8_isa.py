"""``dtype="int8"`` needs int8 matrix instructions: without them it is refused before any
quantizing, with a message that names what is missing (these run on every CPU; the int8 model
itself is tested in test_int8.py where it can run)."""

from __future__ import annotations

import pytest

from bertattn import Bert
from bertattn.bert import int8, int8_speed

NO_INT8 = {"fpu", "sse2", "avx", "avx2", "fma", "f16c"}  # an AVX2 CPU's flags, no VNNI or AMX


@pytest.fixture(autouse=True)
def _fresh_verdict():
    """available() is decided once per process: each test decides afresh, and leaves the real
    verdict behind."""
    int8.available.cache_clear()
    yield
    int8.available.cache_clear()


@pytest.fixture
def avx2_only(monkeypatch) -> None:
    monkeypatch.setattr(int8, "cpu_flags", lambda: set(NO_INT8))


def test_isa_named_from_the_flags(monkeypatch) -> None:
    for flags, want in (
        (NO_INT8, "none"),
        (NO_INT8 | {"avx512f", "avx512_vnni"}, "avx512_vnni"),
        (NO_INT8 | {"avx_vnni", "amx_int8"}, "amx_int8, avx_vnni"),
        (set(), "unknown"),
    ):
        monkeypatch.setattr(int8, "cpu_flags", lambda flags=flags: set(flags))
        assert int8.cpu_int8_isa() == want


def test_refused_without_int8_instructions(avx2_only) -> None:
    why = int8.available()
    assert why is not None and "no int8 matrix instructions" in why
    assert "AVX512-VNNI" in why and "float32" in why  # what is missing, and the way out


@pytest.mark.parametrize("flags", [NO_INT8 | {"avx512_vnni"}, NO_INT8 | {"amx_int8"}, set()])
def test_not_refused_for_the_cpu_where_it_has_them_or_cannot_tell(monkeypatch, flags) -> None:
    monkeypatch.setattr(int8, "cpu_flags", lambda: set(flags))
    why = int8.available()
    assert why is None or "instructions" not in why  # (a build without the ops says so)


def test_load_refuses_before_quantizing(avx2_only, minilm_dir, monkeypatch) -> None:
    def must_not_run(*args, **kwargs):
        raise AssertionError("quantized on a CPU without int8 instructions")

    monkeypatch.setattr(int8, "_smoothing", must_not_run)
    monkeypatch.setattr(int8_speed, "time_speed", must_not_run)  # the flags decide: no kernel runs
    with pytest.raises(ValueError, match=r"int8 cannot run here: this CPU has no int8 matrix"):
        Bert.load(minilm_dir, dtype="int8")


def test_encode_cli_says_why_and_writes_nothing(avx2_only, cli, minilm_dir, tmp_path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one line\nanother line\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    r = cli("encode", src, "-o", out, "--model", minilm_dir, "--dtype", "int8")
    assert r.code == 1, r
    assert "no int8 matrix instructions" in r.err and "float32" in r.err, r.err
    assert not out.exists()
