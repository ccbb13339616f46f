"""The packed (varlen) path: padding.py and the ``varlen`` backend, against ``math``."""

from __future__ import annotations

import pytest
import torch
from attention_helpers import max_err, random_module, upcast

import bertattn
from bertattn.attention.dispatch import VARLEN_MIN_PAD_FRACTION, choose_backend
from bertattn.attention.masks import PreparedMask
from bertattn.attention.padding import pack_padding_mask, pad, unpad

E, H = 16, 4
# lengths 5, 2, 0 (all padding), and a non-left-aligned row
KPM = torch.tensor(
    [
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 1, 1, 0, 1],
    ],
    dtype=torch.bool,
)


def _x(dtype=torch.float32) -> torch.Tensor:
    return torch.randn(4, 5, E, generator=torch.Generator().manual_seed(3)).to(dtype)


def test_pack_unpad_pad_round_trip() -> None:
    packed = pack_padding_mask(KPM)
    assert packed.offsets == (0, 5, 7, 7, 10)
    assert packed.cu_seqlens.tolist() == [0, 5, 7, 7, 10]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 5 and packed.total == 10
    assert packed.pad_fraction == pytest.approx(1 - 10 / 20)
    x = _x()
    flat = unpad(x, packed)  # (T, E)
    assert flat.shape == (10, E)
    torch.testing.assert_close(flat[7:], x[3, [1, 2, 4]])  # order kept inside a sequence
    back = pad(flat, packed)
    torch.testing.assert_close(back[KPM], x[KPM], atol=0, rtol=0)
    assert (back[~KPM] == 0).all()


def test_pack_refuses_a_non_2d_mask() -> None:
    with pytest.raises(ValueError, match=r"expected \(batch, seq_len\)"):
        pack_padding_mask(torch.ones(2, 3, 4))


def test_varlen_equals_math_on_real_tokens_and_zeros_padding() -> None:
    m = random_module(E, H)
    x = _x()
    with torch.no_grad():
        m.backend = "math"
        ref, _ = m(x, key_padding_mask=KPM)
        m.backend = "varlen"
        out, w = m(x, key_padding_mask=KPM, need_weights=False)
    assert w is None
    torch.testing.assert_close(out[KPM], ref[KPM], atol=1e-6, rtol=0)
    assert (out[~KPM] == 0).all()
    assert m.last_dispatch.backend == "varlen"


def test_varlen_without_padding_mask_equals_math() -> None:
    m = random_module(E, H)
    x = _x()
    with torch.no_grad():
        m.backend = "math"
        ref, _ = m(x)
        m.backend = "varlen"
        out, _ = m(x, need_weights=False)
    torch.testing.assert_close(out, ref, atol=1e-6 * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_low_precision_relative_rule(dtype) -> None:
    m = random_module(E, H, dtype=dtype)
    ref_m = upcast(m)
    x = _x(dtype)
    with torch.no_grad():
        ref, _ = ref_m(x.double(), key_padding_mask=KPM)
        m.backend = "math"
        low, _ = m(x, key_padding_mask=KPM)
        m.backend = "varlen"
        out, _ = m(x, key_padding_mask=KPM, need_weights=False)
    base = max_err(low[KPM], ref[KPM])
    ulp = torch.finfo(dtype).eps * ref[KPM].abs().max().item()
    assert max_err(out[KPM], ref[KPM]) <= 2 * base + ulp


def test_varlen_gradients_match_math_on_real_tokens() -> None:
    m = random_module(E, H)
    x = _x()
    grads = {}
    for backend in ("math", "varlen"):
        m.backend = backend
        m.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        out, _ = m(xg, key_padding_mask=KPM, need_weights=False)
        out[KPM].square().sum().backward()
        grads[backend] = {"x": xg.grad, **{n: p.grad for n, p in m.named_parameters()}}
    scale = max(g.abs().max().item() for g in grads["math"].values())
    for name, a in grads["math"].items():
        # k_linear.bias has a true gradient of 0 (softmax ignores a per-row constant): what
        # is left is rounding noise of terms of size `scale`, hence one tolerance for all
        torch.testing.assert_close(grads["varlen"][name], a, atol=2e-6 * scale, rtol=0)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"mask": torch.ones(5, 5, dtype=torch.bool)}, "mask"),
        ({"attn_bias": torch.zeros(5, 5)}, "attn_bias"),
        ({"key_value": torch.zeros(4, 5, E)}, "key_value"),
        ({"need_weights": True}, "need_weights=True"),
    ],
)
def test_varlen_refuses_what_it_cannot_do(kwargs, named) -> None:
    m = bertattn.MultiHeadAttention(E, H, backend="varlen").eval()
    kwargs.setdefault("need_weights", False)
    with pytest.raises(
        ValueError,
        match=f"backend 'varlen' takes self-attention with key_padding_mask only, got {named}",
    ):
        m(_x(), **kwargs)


def test_attend_refuses_a_packed_backend() -> None:
    m = bertattn.MultiHeadAttention(E, H, backend="varlen").eval()
    with pytest.raises(ValueError, match="works on packed tokens: call attend_packed"):
        m.attend(_x(), PreparedMask())


def test_auto_packs_only_when_padding_pays() -> None:
    low = VARLEN_MIN_PAD_FRACTION / 2
    assert choose_backend("auto", need_weights=False, pad_fraction=low)[0] == "sdpa"
    name, why = choose_backend("auto", need_weights=False, pad_fraction=0.5)
    assert name == "varlen" and "50% of the batch is padding" in why
    assert choose_backend("auto", need_weights=True, pad_fraction=0.5)[0] == "math"
    assert choose_backend("auto", need_weights=False)[0] == "sdpa"  # module level: no packing
    name, why = choose_backend("auto", need_weights=False, pad_fraction=0.5, device_type="cuda")
    assert name == "sdpa" and "on cuda packing measured no faster" in why


def test_fp16_large_finite_bias_is_not_turned_into_a_dead_row() -> None:
    """A row of -1e9 bias is finite, so its query still attends (softmax ignores a per-row
    constant). Cast to float16 it would become -inf and the row would come out zero; sdpa
    clamps it to float16's range. Checked against float64 by the relative rule."""
    m = random_module(E, H, dtype=torch.float16)
    x = _x(torch.float16)
    bias = torch.zeros(5, 5)
    bias[2] = -1e9
    with torch.no_grad():
        ref, _ = upcast(m)(x.double(), attn_bias=bias.double())
        m.backend = "math"
        low, _ = m(x, attn_bias=bias)
        m.backend = "sdpa"
        out, _ = m(x, attn_bias=bias, need_weights=False)
    assert (out[:, 2] - m.out_linear.bias).abs().max() > 0.1  # not a zeroed (dead) row
    ulp = torch.finfo(torch.float16).eps * ref.abs().max().item()
    assert max_err(out, ref) <= 2 * max_err(low, ref) + ulp
