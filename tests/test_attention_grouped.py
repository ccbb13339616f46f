"""Grouped-query heads, a head size of its own, a score scale, a causal switch and q/k norms in
MultiHeadAttention, on every backend: against a float64 reference written out here (key/value
heads repeated by hand), against torch's ``scaled_dot_product_attention(enable_gqa=True)``,
and every refusal by its message."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertattn import MultiHeadAttention
from bertattn.attention import BACKENDS, BackendSpec, dispatch, register_backend
from bertattn.attention.backends import math_attention, varlen_attention

BACKENDS_ALL = ("math", "sdpa", "varlen", "auto")


def _module(backend: str = "auto", seed: int = 0, **options: object) -> MultiHeadAttention:
    """A grouped module (6 query heads sharing 2 key/value heads of size 8, width 20) with
    random non-zero weights, in eval; ``options`` override the shape."""
    shape: dict[str, object] = {"num_kv_heads": 2, "head_dim": 8}
    shape.update(options)
    torch.manual_seed(seed)
    m = MultiHeadAttention(20, 6, dropout=0.0, backend=backend, **shape).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.4)
    return m


def _projected(m: MultiHeadAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q ``(B, H, L, D)``, k and v ``(B, Hkv, L, D)`` in float64, written out: the three
    projections, the heads split, an RMSNorm over D on q and k when the module has one."""
    x = x.double()
    b, n, _ = x.shape
    d = m.head_dim

    def proj(lin: torch.nn.Linear, heads: int) -> torch.Tensor:
        out = x @ lin.weight.double().T + lin.bias.double()
        return out.view(b, n, heads, d).transpose(1, 2)

    q = proj(m.q_linear, m.num_heads)
    k, v = proj(m.k_linear, m.num_kv_heads), proj(m.v_linear, m.num_kv_heads)
    if hasattr(m, "q_norm"):

        def rms(t: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * weight.double()

        q = rms(q, m.q_norm.weight, m.q_norm.eps)
        k = rms(k, m.k_norm.weight, m.k_norm.eps)
    return q, k, v


def _allowed(keep: torch.Tensor, causal: bool = False, window: int | None = None) -> torch.Tensor:
    """``(B, 1, L, L)`` bool: the keys each query may see (padding, triangle, band)."""
    b, n = keep.shape
    allowed = keep[:, None, None, :].expand(b, 1, n, n).clone()
    i = torch.arange(n)
    if causal:
        allowed &= torch.tril(torch.ones(n, n, dtype=torch.bool))[None, None]
    if window is not None:
        allowed &= ((i[:, None] - i[None, :]).abs() <= window)[None, None]
    return allowed


def _out(m: MultiHeadAttention, ctx: torch.Tensor) -> torch.Tensor:
    """Merge ``(B, H, L, D)`` heads and project out, in float64."""
    b, h, n, d = ctx.shape
    merged = ctx.transpose(1, 2).reshape(b, n, h * d)
    return merged @ m.out_linear.weight.double().T + m.out_linear.bias.double()


def _expanded_reference(
    m: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """The attention in float64 with every key/value head copied for the query heads it
    serves (query head h reads key/value head h // g), scores * scale, softmax."""
    q, k, v = _projected(m, x)
    g = m.num_heads // m.num_kv_heads
    k = torch.stack([k[:, h // g] for h in range(m.num_heads)], dim=1)
    v = torch.stack([v[:, h // g] for h in range(m.num_heads)], dim=1)
    scale = 1.0 / math.sqrt(m.head_dim) if m.scale is None else m.scale
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    ctx = torch.nan_to_num(torch.softmax(scores, dim=-1)) @ v  # a row with no key: zeros
    return _out(m, ctx)


def _torch_gqa_reference(
    m: MultiHeadAttention, x: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """The same through torch's own grouped kernel: ``enable_gqa=True`` on the unexpanded
    key/value heads (the rows with no key at all zeroed by hand)."""
    q, k, v = _projected(m, x)
    ctx = F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=m.scale, enable_gqa=True
    )
    ctx = ctx.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    return _out(m, ctx)


def _batch(n: int = 9, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(3, n, 20)`` inputs and a padding mask: full, short, and one with no token at all."""
    torch.manual_seed(seed)
    x = torch.randn(3, n, 20)
    keep = torch.ones(3, n, dtype=torch.bool)
    keep[1, n - 4 :] = False
    keep[2, :] = False
    return x, keep


def test_the_two_references_agree() -> None:
    m = _module(scale=0.21, qk_norm=True)
    x, keep = _batch()
    allowed = _allowed(keep, causal=True)
    want = _expanded_reference(m, x, allowed)
    torch.testing.assert_close(_torch_gqa_reference(m, x, allowed), want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS_ALL)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_kv_heads": 1},  # multi-query
        {"num_kv_heads": 6, "head_dim": 5},  # every head its own, a head size != 20 / 6
        {"scale": 0.21},
        {"qk_norm": True},
        {"causal": True, "qk_norm": True, "scale": 0.3},
    ],
    ids=["grouped", "multi-query", "head-dim", "scale", "qk-norm", "causal-all"],
)
def test_every_backend_matches_both_references(backend: str, options: dict) -> None:
    m = _module(backend, **options)
    x, keep = _batch()
    with torch.no_grad():
        out, _ = m(x, key_padding_mask=keep, need_weights=False)
    allowed = _allowed(keep, causal=m.causal)
    real = keep
    want = _expanded_reference(m, x, allowed)
    torch.testing.assert_close(out[real].double(), want[real], rtol=0, atol=2e-5)
    torch.testing.assert_close(
        out[real].double(), _torch_gqa_reference(m, x, allowed)[real], rtol=0, atol=2e-5
    )


@pytest.mark.parametrize("backend", ("sdpa", "varlen"))
def test_fused_backends_equal_math(backend: str) -> None:
    math_m = _module("math", causal=True, qk_norm=True)
    fused = _module(backend, causal=True, qk_norm=True)
    fused.load_state_dict(math_m.state_dict(), strict=True)
    x, keep = _batch()
    with torch.no_grad():
        want, _ = math_m(x, key_padding_mask=keep, need_weights=False)
        got, _ = fused(x, key_padding_mask=keep, need_weights=False)
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=1e-5)


def test_the_causal_option_is_a_lower_triangular_mask() -> None:
    causal = _module("math", causal=True)
    plain = _module("math")
    plain.load_state_dict(causal.state_dict(), strict=True)
    x, _ = _batch()
    tri = torch.tril(torch.ones(9, 9, dtype=torch.bool))
    got, w = causal(x)
    want, w_want = plain(x, mask=tri)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(w, w_want, rtol=0, atol=0)
    assert torch.all(w[..., ~tri] == 0) and torch.all(w[..., tri] > 0)


@pytest.mark.parametrize("backend", ("math", "sdpa", "varlen"))
def test_a_sliding_window_with_grouped_heads(backend: str) -> None:
    """A window short and long enough to be exploited (300 tokens, 2 either side), with two
    key/value heads for six query heads, equals the reference with the band."""
    m = _module(backend, window=2)
    x, keep = _batch(300)
    with torch.no_grad(), dispatch.explain() as ex:
        out, _ = m(x, key_padding_mask=keep, need_weights=False)
    allowed = _allowed(keep, window=2)
    torch.testing.assert_close(
        out[keep].double(), _expanded_reference(m, x, allowed)[keep], rtol=0, atol=2e-5
    )
    assert "window 2" in str(ex) and "2 key/value heads, each shared by 3" in str(ex)
    if backend == "sdpa":
        assert "window 2: exploited" in str(ex)


def test_fully_masked_rows_give_zero_weights_and_context() -> None:
    """Left padding with a causal mask: the padding queries before the first real token see no
    key at all; their weights and (without biases) outputs are zeros, never NaN."""
    torch.manual_seed(4)
    m = MultiHeadAttention(
        20, 6, dropout=0.0, backend="math", num_kv_heads=2, head_dim=8, causal=True, bias=False
    ).eval()
    x = torch.randn(2, 6, 20)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :3] = False  # left padding: queries 0..2 of row 1 have no key j <= i
    out, w = m(x, key_padding_mask=keep)
    assert torch.all(w[1, :, :3] == 0) and torch.all(out[1, :3] == 0)
    assert not torch.isnan(out).any()
    for backend in ("sdpa", "varlen"):
        other = MultiHeadAttention(20, 6, dropout=0.0, backend=backend, num_kv_heads=2,
                                   head_dim=8, causal=True, bias=False).eval()  # fmt: skip
        other.load_state_dict(m.state_dict(), strict=True)
        with torch.no_grad():
            got, _ = other(x, key_padding_mask=keep, need_weights=False)
        assert torch.all(got[1, :3] == 0) and not torch.isnan(got).any()
        torch.testing.assert_close(got[keep], out[keep], rtol=0, atol=1e-5)


def test_math_weights_per_query_head() -> None:
    m = _module("math", num_kv_heads=3)
    x, keep = _batch()
    _, w = m(x, key_padding_mask=keep)
    assert w.shape == (3, 6, 9, 9)
    live = keep[:2]
    torch.testing.assert_close(w[:2].sum(-1), torch.ones(2, 6, 9), rtol=0, atol=1e-6)
    assert torch.all(w[:2][..., ~live[:, None, None, :].expand(2, 6, 9, 9)] == 0)


def test_the_articles_module_and_state_dict_are_unchanged() -> None:
    plain = MultiHeadAttention(16, 4)
    same = MultiHeadAttention(16, 4, num_kv_heads=4)
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == {
        k: tuple(v.shape) for k, v in same.state_dict().items()
    }
    assert all(tuple(v.shape) in ((16, 16), (16,)) for v in plain.state_dict().values())
    grouped = MultiHeadAttention(16, 4, num_kv_heads=2, head_dim=6, qk_norm=True)
    shapes = {k: tuple(v.shape) for k, v in grouped.state_dict().items()}
    assert shapes["q_linear.weight"] == (24, 16)
    assert shapes["k_linear.weight"] == shapes["v_linear.weight"] == (12, 16)
    assert shapes["out_linear.weight"] == (16, 24)
    assert shapes["q_norm.weight"] == shapes["k_norm.weight"] == (6,)
    with torch.no_grad():  # the shared storage itself, no copy
        weight, bias = grouped.qkv_weight()
    assert weight.shape == (48, 16) and bias is not None and bias.shape == (48,)
    assert grouped.k_linear.weight.data_ptr() == weight[24:].data_ptr()  # one storage


def test_sdpa_shares_the_heads_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """sdpa hands torch's kernel the two key/value heads and enable_gqa=True; explain() says
    so, and math says it repeats them."""
    seen: list[tuple[int, bool]] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((k.shape[-3], kwargs.get("enable_gqa", False)))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    x, keep = _batch()
    for backend in ("sdpa", "varlen"):
        seen.clear()
        with torch.no_grad(), dispatch.explain() as ex:
            _module(backend)(x, key_padding_mask=keep, need_weights=False)
        assert seen and all(s == (2, True) for s in seen)
        assert "SDPA enable_gqa=True (no K/V copy per query head)" in str(ex)
    with dispatch.explain() as ex:
        _module("math")(x)
    assert "K and V repeated per query head (math's sharing step)" in str(ex)


def test_cross_attention_with_grouped_heads() -> None:
    m = _module("math", num_kv_heads=3)
    torch.manual_seed(7)
    x, kv = torch.randn(2, 4, 20), torch.randn(2, 6, 20)
    out, _ = m(x, key_value=kv)
    q = (x.double() @ m.q_linear.weight.double().T + m.q_linear.bias.double()).view(2, 4, 6, 8)
    k = (kv.double() @ m.k_linear.weight.double().T + m.k_linear.bias.double()).view(2, 6, 3, 8)
    v = (kv.double() @ m.v_linear.weight.double().T + m.v_linear.bias.double()).view(2, 6, 3, 8)
    ctx = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True
    )
    torch.testing.assert_close(out.double(), _out(m, ctx), rtol=0, atol=2e-5)


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"num_kv_heads must be an int >= 1 that divides "
                       r"num_heads \(6\), got 4"):  # fmt: skip
        MultiHeadAttention(24, 6, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"num_kv_heads must be .* got 0"):
        MultiHeadAttention(24, 6, num_kv_heads=0)
    with pytest.raises(ValueError, match=r"head_dim must be an int >= 1 .* got 0"):
        MultiHeadAttention(24, 6, head_dim=0)
    with pytest.raises(ValueError, match=r"embed_dim \(20\) must be .* or give head_dim="):
        MultiHeadAttention(20, 6)
    with pytest.raises(ValueError, match=r"scale must be None .* got -1.0; .*s \*\* -0.5"):
        MultiHeadAttention(24, 6, scale=-1.0)
    with pytest.raises(ValueError, match=r"causal=True with window=2 is not supported"):
        MultiHeadAttention(24, 6, causal=True, window=2)
    with pytest.raises(ValueError, match=r"causal must be"):
        MultiHeadAttention(24, 6, causal="yes")


def _plain_backend(name: str, layout: str) -> None:
    """Register a backend that honours nothing of its own (``takes`` empty)."""
    if layout == "packed":
        register_backend(BackendSpec(name, varlen_attention, returns_weights=False,
                                     layout="packed", packed_bias=True))  # fmt: skip
    else:
        register_backend(BackendSpec(name, math_attention, returns_weights=True))


@pytest.mark.parametrize(
    ("layout", "options", "message"),
    [
        ("padded", {"scale": 0.5}, r"'plain' takes no score scale, and this module has one "
                                   r"\(scale=0.5, not 1/sqrt\(head_dim\)\)"),
        ("padded", {}, r"'plain' cannot share key/value heads, and this module has 2 of them"),
        ("packed", {"num_kv_heads": 6, "causal": True},
         r"'plain' cannot honour a causal mask \(this module was built with causal=True\)"),
        ("packed", {}, r"'plain' cannot share key/value heads"),
    ],
)  # fmt: skip
def test_a_backend_that_cannot_honour_an_input_refuses_it_by_name(
    layout: str, options: dict, message: str
) -> None:
    _plain_backend("plain", layout)
    try:
        m = _module("plain", **options)
        x, keep = _batch()
        with pytest.raises(ValueError, match=message + r".*use backend 'varlen', 'sdpa'"):
            m(x, key_padding_mask=keep, need_weights=False)
    finally:
        del BACKENDS["plain"]


def test_a_packed_window_and_causal_mask_are_refused_together() -> None:
    m = _module("varlen", causal=True)
    from bertattn.attention.padding import pack_padding_mask

    x, keep = _batch()
    packed = pack_padding_mask(keep)
    with pytest.raises(ValueError, match="a packed call takes a window or a causal mask"):
        m.attend_packed(x[keep], packed, window=2)
