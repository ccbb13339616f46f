"""The CPU's int8 instructions name the forms its product is timed in; they no longer refuse int8
by themselves: without VNNI, 7-bit weights keep AVX2's unsigned x signed product exact (the
timing and exactness are tested in test_int8_forms.py and test_int8_speed.py)."""

from __future__ import annotations

import pytest

from bertattn.encoder import int8, int8_speed
from bertattn.encoder.int8_forms import S8_F32, U8_F32, U8_S7_F32

NO_INT8 = {"fpu", "sse2", "avx", "avx2", "fma", "f16c"}  # an AVX2 CPU's flags, no VNNI or AMX


@pytest.fixture(autouse=True)
def _fresh_verdict():
    """available() is decided once per process: each test decides afresh, and leaves the real
    verdict behind."""
    int8.available.cache_clear()
    int8_speed._speeds.clear()
    yield
    int8.available.cache_clear()
    int8_speed._speeds.clear()


def test_isa_named_from_the_flags(monkeypatch) -> None:
    for flags, want in (
        (NO_INT8, "none"),
        (NO_INT8 | {"avx512f", "avx512_vnni"}, "avx512_vnni"),
        (NO_INT8 | {"avx_vnni", "amx_int8"}, "amx_int8, avx_vnni"),
        (set(), "unknown"),
    ):
        monkeypatch.setattr(int8, "cpu_flags", lambda flags=flags: set(flags))
        assert int8.cpu_int8_isa() == want


@pytest.mark.parametrize(
    ("flags", "seven_bit"),
    [(NO_INT8, True), (NO_INT8 | {"avx512_vnni"}, False), (NO_INT8 | {"amx_int8"}, False)],
)
def test_the_flags_choose_the_forms_timed_not_a_refusal(monkeypatch, flags, seven_bit) -> None:
    monkeypatch.setattr(int8, "cpu_flags", lambda: set(flags))
    why = int8.available()
    assert why is None or "torch build" in why  # only a build without the ops is refused so
    forms = int8_speed.candidates(set(flags))
    assert forms[:2] == (U8_F32, S8_F32) and (U8_S7_F32 in forms) == seven_bit


def test_an_avx2_cpu_is_timed_in_the_seven_bit_form(monkeypatch) -> None:
    """Without VNNI the 7-bit form is timed like the others and kept where it alone is exact."""
    timed = []

    def fake(form, **kwargs):
        timed.append(form)
        saturates = form.weight_bits == 8  # AVX2's 16-bit pair sums, whatever the sign
        return int8_speed.Speed(
            256, 384, 1536, 1.0, 2.0, "AVX2 CPU", 2, False, form, 0.1 if saturates else 0.0
        )

    monkeypatch.setattr(int8_speed, "cpu_flags", lambda: set(NO_INT8))
    monkeypatch.setattr(int8_speed, "time_speed", fake)
    kept = int8.check_speed()
    assert timed == [U8_F32, S8_F32, U8_S7_F32]
    assert kept.form == U8_S7_F32 and kept.exact
