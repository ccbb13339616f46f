"""The forms of the int8 product (u8 or s8 activations; float32, bfloat16 or float16 out): which
a CPU is offered, how exactness is judged, and which form ``check_speed`` keeps. Runs on every
CPU: the products are stand-ins but for ``test_the_real_forms_are_timed_and_bounded``."""

from __future__ import annotations

import time

import pytest
import torch

from bertattn.encoder import int8, int8_speed
from bertattn.encoder.int8_forms import (
    S8_F32,
    U8_BF16,
    U8_F16,
    U8_F32,
    U8_S7_F32,
    Form,
    candidates,
    error,
    exact,
    gelu_form,
)
from bertattn.encoder.int8_speed import Speed

AVX2 = {"avx", "avx2", "fma"}


@pytest.fixture(autouse=True)
def _fresh_speed():
    int8_speed._speeds.clear()
    yield
    int8_speed._speeds.clear()


def test_forms_offered_by_the_cpus_flags() -> None:
    assert candidates(AVX2) == (U8_F32, S8_F32, U8_S7_F32)  # 8-bit weights saturate there
    assert candidates(AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16"}) == (U8_F32, S8_F32, U8_BF16)
    assert candidates(AVX2 | {"amx_int8", "amx_bf16", "amx_fp16"}) == (
        U8_F32, S8_F32, U8_BF16, U8_F16,
    )  # fmt: skip
    assert str(U8_F32) == "u8 x s8 -> float32" and str(S8_F32) == "s8 x s8 -> float32"
    assert str(U8_S7_F32) == "u8 x s7 -> float32" and U8_S7_F32.weight_limit == 63


def test_a_form_is_checked() -> None:
    with pytest.raises(ValueError, match="activations must be 'u8' or 's8', got 'u4'"):
        type(U8_F32)("u4", torch.float32)
    with pytest.raises(ValueError, match="writes float32, bfloat16 or float16"):
        type(U8_F32)("u8", torch.float64)


def test_the_gelu_product_takes_7_bit_activations_where_weights_are_7_bit() -> None:
    """Without VNNI a u8 x s8 pair's 16-bit sum saturates: the product reading GELU outputs
    keeps its 8-bit weights and gives up an activation bit instead (u7 x s8: the same kernel,
    a pair's sum as bounded); every other form is its own."""
    form = gelu_form(U8_S7_F32)
    assert str(form) == "u7 x s8 -> float32" and form.weight_limit == 127 and form.unsigned
    assert 2 * 127 * 127 <= 2**15 - 1 and 2 * 255 * 63 <= 2**15 - 1 < 2 * 255 * 127
    assert [gelu_form(f) for f in (U8_F32, S8_F32, U8_BF16, U8_F16)] == [
        U8_F32, S8_F32, U8_BF16, U8_F16,
    ]  # fmt: skip
    lin = int8.Int8Linear(torch.randn(16, 32), None, form=form)
    assert lin.levels == 127 and int8.QMIN == -128
    assert int(lin.weight_int8.abs().max()) == 127  # 8-bit weights
    with pytest.raises(ValueError, match="activation_bits must be 8, or 7 with u8 activations; "
                       "got 7 with s8"):  # fmt: skip
        Form("s8", torch.float32, activation_bits=7)


def test_7_bit_gelu_codes_stay_within_0_127() -> None:
    """The fused GELU step quantizes to the u7 codes the form allows (the kernel's
    unsigned bytes 0-127: a byte of 128 or more would saturate the pair sum) and back within
    half a step of the exact GELU."""
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(40, 64, generator=gen) * 3.0
    u[0] = -5.0  # a row of GELU outputs near GELU_MIN only
    one = torch.ones(1)
    zero = torch.zeros(1)
    q, s, sz = int8._dequant_gelu_quant(u, one, zero, torch.zeros(64), zero, 127, True)
    assert q.dtype == torch.uint8 and int(q.max()) <= 127
    assert int(q.max(1).values.max()) == 127  # the range is used to its top
    back = s * (q.float() - 128.0) - sz
    err = (back - torch.nn.functional.gelu(u)).abs()
    assert bool((err <= s / 2 + 1e-6).all()), float((err - s / 2).max())


def _operands(rows: int = 16, k: int = 64, n: int = 48):
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(-128, 128, (rows, k), dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, generator=gen) + 0.01
    exact_product = (codes.double() @ w.double().T) * scale.double()
    return codes, w, scale, exact_product


def test_exactness_is_judged_against_the_integer_product() -> None:
    codes, w, scale, want = _operands()
    assert error(want.float(), codes, w, scale) < 1e-7
    # a saturating kernel (AVX2's 16-bit pair sums clipped): several % off, in every dtype
    clipped = want.clamp(-0.9 * want.abs().max(), 0.9 * want.abs().max())
    err = error(clipped.float(), codes, w, scale)
    assert err == pytest.approx(0.1, rel=1e-6)
    assert not any(exact(f, err) for f in (U8_F32, U8_BF16, U8_F16))
    # bfloat16's own rounding is within its tolerance, not within float32's
    rounded = error(want.to(torch.bfloat16), codes, w, scale)
    assert 1e-5 < rounded and exact(U8_BF16, rounded) and not exact(U8_F32, rounded)


def _speed(form, ratio: float, err: float | None = 0.0) -> Speed:
    return Speed(256, 384, 1536, 1.0 / ratio, 1.0, "Test CPU 9000", 2, False, form, err)


def test_the_fastest_exact_form_is_kept(monkeypatch) -> None:
    timed = {
        U8_F32: _speed(U8_F32, 4.6),
        S8_F32: _speed(S8_F32, 0.001, None),  # a reference kernel: never checked
        U8_BF16: _speed(U8_BF16, 4.8, 0.2),  # faster, but not exact
    }
    monkeypatch.setattr(int8_speed, "candidates", lambda flags: tuple(timed))
    monkeypatch.setattr(int8_speed, "time_speed", lambda form, **k: timed[form])
    kept = int8.check_speed()
    assert kept.form == U8_F32 and kept.ratio == pytest.approx(4.6)


@pytest.mark.parametrize(("bf16_ratio", "kept"), [(4.8, U8_F32), (5.2, U8_F32), (5.4, U8_BF16)])
def test_a_16_bit_output_must_be_clearly_faster(monkeypatch, bf16_ratio, kept) -> None:
    """bfloat16 out rounds before the zero-point correction: kept over float32 out only at
    1.15x its speed (4.6 x 1.15 = 5.29)."""
    timed = {U8_F32: _speed(U8_F32, 4.6), U8_BF16: _speed(U8_BF16, bf16_ratio, 0.001)}
    monkeypatch.setattr(int8_speed, "candidates", lambda flags: tuple(timed))
    monkeypatch.setattr(int8_speed, "time_speed", lambda form, **k: timed[form])
    assert int8.check_speed().form == kept


def test_no_fast_exact_form_is_refused_with_every_forms_numbers(monkeypatch) -> None:
    timed = {U8_F32: _speed(U8_F32, 0.26, None), S8_F32: _speed(S8_F32, 3.0, 0.1)}
    monkeypatch.setattr(int8_speed, "candidates", lambda flags: tuple(timed))
    monkeypatch.setattr(int8_speed, "time_speed", lambda form, **k: timed[form])
    with pytest.raises(ValueError) as info:
        int8.check_speed()
    msg = str(info.value)
    assert msg.startswith("int8 is refused on this CPU (Test CPU 9000): none of the 2 forms"), msg
    assert "u8 x s8 -> float32: int8" in msg and "0.26x" in msg
    assert "s8 x s8 -> float32: int8" in msg and "3x" in msg and "NOT exact: off by 0.1" in msg
    assert "dtype='float32'" in msg


def test_the_real_forms_are_timed_and_bounded() -> None:
    """Every form this CPU is offered, timed for real: bounded whatever its kernel costs, and
    a form fast enough to keep is checked against the exact product."""
    if int8.available() is not None and "torch build" in int8.available():
        pytest.skip(int8.available())
    start = time.perf_counter()
    speeds = int8_speed.time_forms()
    took = time.perf_counter() - start
    assert took < 20, (took, [str(s) for s in speeds])
    assert [s.form for s in speeds] == list(candidates(int8_speed.cpu_flags()))
    for s in speeds:
        assert s.int8_s > 0 and s.float32_s > 0 and (s.stopped or s.rows == 256)
        assert (s.error is not None) == (s.ratio >= int8_speed.MIN_SPEEDUP), s


def test_u8_codes_are_the_s8_codes_plus_128() -> None:
    q = torch.tensor([-128.0, -1.0, 0.0, 127.0])
    assert int8._codes(q, unsigned=False).tolist() == [-128, -1, 0, 127]
    u = int8._codes(q, unsigned=True)
    assert u.dtype == torch.uint8 and u.tolist() == [0, 127, 128, 255]


@pytest.mark.parametrize("form", [U8_F32, S8_F32, U8_F16])
def test_a_linear_takes_its_form(form) -> None:
    lin = torch.nn.Linear(32, 16)
    q = int8.Int8Linear.from_linear(lin, form=form)
    assert q.unsigned == (form.activations == "u8") and q.out_dtype == form.out
    assert f"activations={form.activations}" in repr(q)
    with torch.no_grad():
        lin.weight.mul_(4000.0)  # 128 * sum|w| per row passes float16's range
    assert int8.Int8Linear.from_linear(lin, form=form).out_dtype == torch.float32
