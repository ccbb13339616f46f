"""Rotary positions and local windows in MultiHeadAttention, on every backend, against a plain
float64 reference written here and against transformers' own rotation."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

from bertattn import MultiHeadAttention
from bertattn.attention import dispatch
from bertattn.attention.rotary import (
    apply_rotation,
    inverse_frequencies,
    rotation_for_packed,
    rotation_for_positions,
)
from bertattn.attention.window import band_bias, local_attention, tile_bias

BACKENDS = ("math", "sdpa", "varlen")


def _reference(module: MultiHeadAttention, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The attention written out in float64: projections, rotation by position (pairs i and
    i + D/2), scores / sqrt(D), the window and the padding as -inf, softmax, weighted sum."""
    x = x.double()
    b, n, e = x.shape
    h, d = module.num_heads, module.head_dim

    def proj(lin: torch.nn.Linear) -> torch.Tensor:
        w = lin.weight.double()
        out = x @ w.T + (0 if lin.bias is None else lin.bias.double())
        return out.view(b, n, h, d).transpose(1, 2)  # (B, H, L, D)

    q, k, v = proj(module.q_linear), proj(module.k_linear), proj(module.v_linear)
    if module.rotary_theta is not None:
        pos = torch.arange(n, dtype=torch.float64)
        freq = module.rotary_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = pos[:, None] * freq[None, :]  # (L, D/2)
        c, s = ang.cos(), ang.sin()

        def turn(t: torch.Tensor) -> torch.Tensor:
            a, bb = t[..., : d // 2], t[..., d // 2 :]
            return torch.cat((a * c - bb * s, bb * c + a * s), dim=-1)

        q, k = turn(q), turn(k)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    allowed = keep[:, None, None, :].expand(b, 1, n, n).clone()
    if module.window is not None:
        i = torch.arange(n)
        allowed &= ((i[:, None] - i[None, :]).abs() <= module.window)[None, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    ctx = torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)
    ctx = ctx.transpose(1, 2).reshape(b, n, e)
    out = ctx @ module.out_linear.weight.double().T
    if module.out_linear.bias is not None:
        out = out + module.out_linear.bias.double()
    return out


def test_rotation_matches_transformers_rotate_half() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
    inv = inverse_frequencies(16, 10000.0)
    rot = rotation_for_positions(torch.arange(7), inv, 10000.0)
    ours = apply_rotation(q, k, rot)
    theirs = apply_rotary_pos_emb(q, k, rot.cos[None], rot.sin[None])
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=1e-6)


def test_rotated_scores_depend_on_the_distance_only() -> None:
    """q_m . k_n after rotation depends on m - n: shifting both positions changes nothing."""
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8).double(), torch.randn(1, 1, 1, 8).double()
    inv = inverse_frequencies(8, 100.0).double()

    def score(m: int, n: int) -> float:
        rq = rotation_for_positions(torch.tensor([m]), inv, 100.0)
        rk = rotation_for_positions(torch.tensor([n]), inv, 100.0)
        a = apply_rotation(q, q, rq)[0]
        bk = apply_rotation(k, k, rk)[0]
        return float((a * bk).sum())

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-9)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_packed_tables_restart_per_sequence() -> None:
    inv = inverse_frequencies(4, 10.0)
    rot = rotation_for_packed(torch.tensor([0, 1, 2, 0, 1]), inv, 10.0)
    assert rot.cos.shape == (5, 1, 4)
    torch.testing.assert_close(rot.cos[3], rot.cos[0])
    torch.testing.assert_close(rot.sin[4], rot.sin[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("theta", "window"), [(10000.0, None), (None, 2), (160.0, 3)])
def test_module_options_match_reference(
    backend: str, theta: float | None, window: int | None
) -> None:
    torch.manual_seed(2)
    m = MultiHeadAttention(32, 4, dropout=0.0, backend=backend, rotary_theta=theta, window=window)
    m.eval()
    x = torch.randn(3, 11, 32)
    keep = torch.ones(3, 11, dtype=torch.bool)
    keep[1, 7:] = False
    keep[2, 4:] = False
    out, _ = m(x, key_padding_mask=keep, need_weights=False)
    ref = _reference(m, x, keep)
    torch.testing.assert_close(out[keep].double(), ref[keep], rtol=0, atol=2e-6)


def test_weights_show_the_band() -> None:
    m = MultiHeadAttention(16, 2, dropout=0.0, window=1, rotary_theta=10.0).eval()
    _, w = m(torch.randn(1, 6, 16))
    i = torch.arange(6)
    outside = (i[:, None] - i[None, :]).abs() > 1
    assert torch.all(w[0][:, outside] == 0)
    assert torch.all(w[0][:, ~outside] > 0)


def test_state_dict_is_the_articles() -> None:
    plain = MultiHeadAttention(16, 2)
    rotary = MultiHeadAttention(16, 2, rotary_theta=10000.0, window=4)
    assert list(plain.state_dict()) == list(rotary.state_dict())
    rotary.load_state_dict(plain.state_dict(), strict=True)


def test_local_attention_skips_work_and_is_exact() -> None:
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 700, 8) for _ in range(3))
    band = band_bias(700, 700, 5)
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(local_attention(q, k, v, 5, block=64), full, rtol=0, atol=1e-5)


def test_explain_says_window_exploited_or_masked() -> None:
    m = MultiHeadAttention(16, 2, dropout=0.0, window=2, backend="varlen").eval()
    keep = torch.ones(2, 300, dtype=torch.bool)
    keep[1, 3:] = False
    with dispatch.explain() as ex:
        m(torch.randn(2, 300, 16), key_padding_mask=keep, need_weights=False)
    assert "window 2: exploited on 1 of 2 sequences" in str(ex)
    m = MultiHeadAttention(16, 2, dropout=0.0, window=2, backend="sdpa").eval()
    with dispatch.explain() as ex:
        m(torch.randn(1, 9, 16), need_weights=False)
    assert "window 2: masked" in str(ex)


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="window must be None"):
        MultiHeadAttention(16, 2, window=-1)
    with pytest.raises(ValueError, match="even head size"):
        MultiHeadAttention(15, 5, rotary_theta=10.0)
    m = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match="no rotary positions"):
        m(torch.randn(1, 3, 16), positions=torch.arange(3))
    r = MultiHeadAttention(16, 2, rotary_theta=10.0)
    with pytest.raises(ValueError, match="self-attention"):
        r(torch.randn(1, 3, 16), key_value=torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        r(torch.randn(1, 3, 16), positions=torch.arange(4))


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_a_long_padded_window_matches_the_reference(backend: str) -> None:
    """sdpa skips the keys out of reach on a long padded batch (math masks them): both equal
    the reference on the real tokens, and padding rows are never NaN."""
    torch.manual_seed(5)
    m = MultiHeadAttention(32, 4, dropout=0.0, backend=backend, rotary_theta=500.0, window=4)
    m.eval()
    x = torch.randn(2, 290, 32)
    keep = torch.ones(2, 290, dtype=torch.bool)
    keep[1, 60:] = False
    with dispatch.explain() as ex:
        out, _ = m(x, key_padding_mask=keep, need_weights=False)
    torch.testing.assert_close(out[keep].double(), _reference(m, x, keep)[keep], rtol=0, atol=2e-6)
    assert not torch.isnan(out).any()
    how = "exploited" if backend == "sdpa" else "masked"
    assert f"window 4: {how}" in str(ex)


def test_local_tiles_share_one_band_per_geometry() -> None:
    """Every inner tile of a long sequence has the same band: it is made once and kept, and
    the kept band is the band itself."""
    a = tile_bias(64, 192, 64, 64, torch.float32, torch.device("cpu"))
    assert tile_bias(64, 192, 64, 64, torch.float32, torch.device("cpu")) is a
    torch.testing.assert_close(a, band_bias(64, 192, 64, q_start=64), rtol=0, atol=0)
    assert tile_bias(64, 192, 64, 0, torch.float32, torch.device("cpu")) is not a


def test_a_band_kept_in_inference_serves_training() -> None:
    """A band first made under inference_mode is a plain tensor: a later training call of the
    same geometry backpropagates through it (an inference tensor would be refused)."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 300, 8) for _ in range(3))
    with torch.inference_mode():
        local_attention(q, k, v, 3)
    q.requires_grad_(True)
    local_attention(q, k, v, 3).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
