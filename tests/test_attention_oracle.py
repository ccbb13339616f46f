"""Parity with the article's own class (the oracle), the fused QKV storage, unbatched input."""

from __future__ import annotations

import pytest
import torch
from attention_helpers import article_pair, backend_names, causal, keep_mask, returns_weights
from torch import nn

import bertattn
from bertattn.bench.article import ArticleMultiHeadAttention

B, L, E, H = 3, 7, 16, 4
ATOL = 1e-6


def _masks() -> dict[str, torch.Tensor | None]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([7, 4, 1])
    padding = (torch.arange(L)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)
    return {
        "none": None,
        "padding (B,1,1,L)": padding,
        "padding int (B,1,1,L)": padding.long(),
        "random (B,1,L,L)": keep_mask((B, 1, L, L), g),
        "causal (B,1,L,L)": causal(L).expand(B, 1, L, L),
        "causal (L,L)": causal(L),
        "random (L,L)": keep_mask((L, L), g),
        "random (B,H,L,L) float": keep_mask((B, H, L, L), g).float(),
    }


MASKS = _masks()


@pytest.mark.parametrize("backend", backend_names())
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_matches_article(backend: str, mask_name: str) -> None:
    article, ours = article_pair(E, H)
    ours.backend = backend
    mask = MASKS[mask_name]
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want_out, want_w = article(x, mask)
        need = returns_weights(backend)
        out, w = ours(x, mask, need_weights=need)
        out_nw, w_nw = ours(x, mask, need_weights=False)
    torch.testing.assert_close(out, want_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(out_nw, want_out, atol=ATOL, rtol=0)
    assert w_nw is None
    if need:
        assert w is not None and w.shape == (B, H, L, L)
        torch.testing.assert_close(w, want_w, atol=ATOL, rtol=0)
    else:
        assert w is None


def test_article_class_as_printed_does_not_parse() -> None:
    """The printed code has ``if mask is not None:`` swallowed by a comment: IndentationError."""
    printed = (
        "def forward(self, x, mask=None):\n"
        "    scores = x\n"
        "    # 应用 mask（如有）if mask is not None:\n"
        "        scores = scores.masked_fill(mask == 0, -1e9)\n"
        "    return scores\n"
    )
    with pytest.raises(IndentationError):
        compile(printed, "<article>", "exec")


def test_article_2d_padding_mask_is_misread_ours_refuses() -> None:
    """The article reads a (B, L) mask as (Lq, Lk); with B == L that is silently wrong."""
    article, ours = article_pair(E, H)
    x = torch.randn(L, L, E)  # batch == seq_len
    pad = torch.ones(L, L, dtype=torch.bool).triu()  # a per-row padding pattern (B, L)
    with torch.no_grad():
        a_out, _ = article(x, pad)
        right, _ = ours(x, key_padding_mask=pad)
    assert not torch.allclose(a_out, right, atol=1e-3)  # the article's answer is not padding
    x2 = torch.randn(3, L, E)
    with pytest.raises(ValueError, match="looks like a per-token padding mask"):
        ours(x2, torch.ones(3, L, dtype=torch.bool))


# ---------------------------------------------------------------------------- float16
def test_article_fill_overflows_on_float16_ours_does_not() -> None:
    article, ours = article_pair(E, H)
    article, ours = article.half(), ours.half()
    x = torch.randn(B, L, E).half()
    mask = causal(L)
    with torch.no_grad(), pytest.raises(RuntimeError, match="overflow"):
        article(x, mask)  # masked_fill(mask == 0, -1e9): -1e9 does not fit in half
    for backend in backend_names():
        ours.backend = backend
        with torch.no_grad():
            out, _ = ours(x, mask, need_weights=False)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
    # and it is right: the article's math in float32 on the same (half) values
    ref_article = ArticleMultiHeadAttention(E, H).eval()
    ref_article.load_state_dict({k: v.float() for k, v in ours.state_dict().items()})
    with torch.no_grad():
        want, _ = ref_article(x.float(), mask)
        ours.backend = "math"
        got, _ = ours(x, mask)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------- fused QKV
def _shares_one_storage(m: bertattn.MultiHeadAttention) -> bool:
    lins = (m.q_linear, m.k_linear, m.v_linear)
    ptrs = {lin.weight.untyped_storage().data_ptr() for lin in lins}
    bptrs = {lin.bias.untyped_storage().data_ptr() for lin in lins}
    contiguous = all(
        lins[i].weight.data_ptr() == lins[0].weight.data_ptr() + i * lins[0].weight.nbytes
        for i in range(3)
    )
    return len(ptrs) == 1 and len(bptrs) == 1 and contiguous


def test_state_dict_keys_are_the_articles() -> None:
    article, ours = article_pair(E, H)
    assert list(ours.state_dict()) == list(article.state_dict())
    assert len(list(ours.parameters())) == 8
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(article.state_dict())


def test_qkv_share_one_storage_after_construction_to_and_assign() -> None:
    article, ours = article_pair(E, H)
    assert _shares_one_storage(ours)
    ours_bf16 = bertattn.MultiHeadAttention(E, H).to(torch.bfloat16)
    assert _shares_one_storage(ours_bf16)
    assert ours_bf16.q_linear.weight.dtype == torch.bfloat16
    fresh = bertattn.MultiHeadAttention(E, H).eval()
    sd = {k: v.clone() for k, v in article.state_dict().items()}
    fresh.load_state_dict(sd, strict=True, assign=True)
    assert _shares_one_storage(fresh), "load_state_dict(assign=True) left q/k/v unpacked"
    x = torch.randn(B, L, E)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x)[0], article(x)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_qkv_share_one_storage_after_deepcopy_and_pickle(how: str) -> None:
    """Both copy each parameter on its own; the copy packs again (else every call would
    concatenate q/k/v) and stays independent of the original."""
    import copy
    import io

    article, ours = article_pair(E, H)
    if how == "deepcopy":
        twin = copy.deepcopy(ours)
    else:
        buf = io.BytesIO()
        torch.save(ours, buf)
        buf.seek(0)
        twin = torch.load(buf, weights_only=False)
    assert _shares_one_storage(twin)
    x = torch.randn(B, L, E)
    with torch.no_grad():
        assert twin.qkv_weight()[0].data_ptr() == twin.q_linear.weight.data_ptr()  # no cat
        torch.testing.assert_close(twin(x)[0], article(x)[0], atol=ATOL, rtol=0)
        twin.k_linear.weight.mul_(2.0)
    assert not torch.equal(twin.k_linear.weight, ours.k_linear.weight)


@pytest.mark.parametrize("grad", [False, True])
def test_in_place_change_of_q_weight_is_seen(grad: bool) -> None:
    article, ours = article_pair(E, H)
    x = torch.randn(B, L, E)
    with torch.no_grad():
        before = ours(x)[0]
        ours.q_linear.weight.mul_(3.0)
        article.q_linear.weight.mul_(3.0)
    with torch.set_grad_enabled(grad):
        after = ours(x)[0]
    assert not torch.allclose(after, before, atol=1e-4)
    torch.testing.assert_close(after, article(x)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("which", ["q_linear", "k_linear", "v_linear"])
def test_replaced_parameter_is_honoured(which: str) -> None:
    article, ours = article_pair(E, H)
    new_w = torch.randn(E, E)
    new_b = torch.randn(E)
    getattr(ours, which).weight = nn.Parameter(new_w.clone())
    getattr(ours, which).bias = nn.Parameter(new_b.clone())
    with torch.no_grad():
        getattr(article, which).weight.copy_(new_w)
        getattr(article, which).bias.copy_(new_b)
    x = torch.randn(B, L, E)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(ours(x)[0], article(x)[0], atol=ATOL, rtol=0)
            kv = torch.randn(B, 5, E)
            out, _ = ours(x, key_value=kv)
        assert out.shape == (B, L, E)


# ---------------------------------------------------------------------------- unbatched
@pytest.mark.parametrize("backend", backend_names())
def test_unbatched_equals_batched(backend: str) -> None:
    _, ours = article_pair(E, H)
    ours.backend = backend
    x = torch.randn(L, E)
    kv = torch.randn(5, E)
    kpm = torch.tensor([1, 1, 0, 1, 0], dtype=torch.bool)
    need = returns_weights(backend)
    with torch.no_grad():
        for kwargs, bkw in [
            ({}, {}),
            ({"mask": causal(L)}, {"mask": causal(L)}),
            (
                {"key_value": kv, "key_padding_mask": kpm},
                {"key_value": kv[None], "key_padding_mask": kpm[None]},
            ),
        ]:
            out, w = ours(x, need_weights=need, **kwargs)
            out_b, w_b = ours(x[None], need_weights=need, **bkw)
            assert out.shape == (L, E)
            torch.testing.assert_close(out, out_b[0], atol=0, rtol=0)
            if need:
                assert w.shape == w_b.shape[1:]
                torch.testing.assert_close(w, w_b[0], atol=0, rtol=0)
