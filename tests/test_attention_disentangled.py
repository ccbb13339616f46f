"""DeBERTa-v2/v3's disentangled attention in MultiHeadAttention: every backend against
transformers' ``DebertaV2Attention`` with random weights, the relative buckets against
transformers' own, the two relative terms as ``math`` records them, every refusal by name."""

from __future__ import annotations

import pytest
import torch
from transformers import DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import (
    DebertaV2Attention,
    build_relative_position,
)

from bertattn import MultiHeadAttention
from bertattn.attention import (
    BACKENDS,
    BackendSpec,
    PreparedMask,
    dispatch,
    record_steps,
    register_backend,
)
from bertattn.attention.backends import math_attention
from bertattn.attention.disentangled import relative_buckets
from bertattn.attention.padding import pack_padding_mask

E, H, MAX_POS = 30, 3, 24

#: (share_att_key, position_buckets, pos_att_type): DeBERTa-v3's choice, then v2's variants
SHAPES = [(True, 8, ("p2c", "c2p")), (False, -1, ("c2p",)), (False, 8, ("c2p", "p2c"))]


def _pair(
    backend: str, share: bool, buckets: int, terms: tuple[str, ...]
) -> tuple[DebertaV2Attention, MultiHeadAttention]:
    """transformers' attention (random weights, seed 0) and ours with the same weights."""
    cfg = DebertaV2Config(
        hidden_size=E,
        num_attention_heads=H,
        intermediate_size=37,
        max_position_embeddings=MAX_POS,
        relative_attention=True,
        position_buckets=buckets,
        max_relative_positions=-1,
        pos_att_type=list(terms),
        share_att_key=share,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    ref = DebertaV2Attention(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
    ours = MultiHeadAttention(E, H, 0.0, backend=backend, disentangled=terms,
                              position_buckets=buckets, max_relative_positions=MAX_POS,
                              share_att_key=share).eval()  # fmt: skip
    attn = ref.self
    state = {}
    for mine, theirs in (("q_linear", "query_proj"), ("k_linear", "key_proj"),
                         ("v_linear", "value_proj"), ("pos_key_proj", "pos_key_proj"),
                         ("pos_query_proj", "pos_query_proj")):  # fmt: skip
        lin = getattr(attn, theirs, None)
        if lin is not None:
            state.update({f"{mine}.weight": lin.weight, f"{mine}.bias": lin.bias})
    state.update({"out_linear.weight": ref.output.dense.weight,
                  "out_linear.bias": ref.output.dense.bias})  # fmt: skip
    ours.load_state_dict(state, strict=True)
    return ref, ours


def _inputs(span: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(2, 19, E)`` inputs, a padding mask (row 1: 11 real tokens), a ``(2S, E)`` table."""
    torch.manual_seed(seed)
    x = torch.randn(2, 19, E)
    keep = torch.ones(2, 19, dtype=torch.bool)
    keep[1, 11:] = False
    return x, keep, torch.randn(2 * span, E)


@pytest.mark.parametrize("backend", ("math", "sdpa", "varlen", "auto"))
@pytest.mark.parametrize(("share", "buckets", "terms"), SHAPES, ids=["v3", "c2p-own", "v2-own"])
def test_every_backend_matches_transformers(
    backend: str, share: bool, buckets: int, terms: tuple[str, ...]
) -> None:
    ref, ours = _pair(backend, share, buckets, terms)
    span = buckets if buckets > 0 else MAX_POS
    x, keep, table = _inputs(span)
    both = keep[:, None, None, :] & keep[:, None, :, None]  # transformers' (B, 1, L, L) mask
    with torch.no_grad():
        want, _ = ref(x, both.long(), rel_embeddings=table)
        out, _ = ours(x, key_padding_mask=keep, rel_embeddings=table, need_weights=False)
        got = ref.output.LayerNorm(out + x)  # transformers' output: norm(dense(ctx) + x)
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=1e-5)


def test_the_buckets_are_transformers() -> None:
    q = torch.zeros(1, 300, 4)
    for buckets, max_position in ((8, 24), (256, 512), (-1, -1)):
        want = build_relative_position(q, q, bucket_size=buckets, max_position=max_position)
        got = relative_buckets(300, 300, buckets=buckets, max_position=max_position)
        assert torch.equal(got, want[0])


def test_math_records_the_two_relative_terms() -> None:
    """The recorded terms are the formula, written out here for every pair: c2p(i, j) =
    q_i . Pk[clamp(bucket(i - j) + S)] * scale, p2c(i, j) = k_j . Pq[clamp(-bucket(j - i) + S)]
    * scale, and they sit between the scaled content scores and the softmax."""
    _, m = _pair("math", True, 8, ("c2p", "p2c"))
    x, _, table = _inputs(8)
    x = x[:, :12]
    with torch.no_grad(), record_steps() as rec:
        m(x, rel_embeddings=table)
    (r,) = rec.records
    assert r.c2p is not None and r.p2c is not None
    pos_k = (table @ m.k_linear.weight.T + m.k_linear.bias).view(16, H, 10).transpose(0, 1)
    pos_q = (table @ m.q_linear.weight.T + m.q_linear.bias).view(16, H, 10).transpose(0, 1)
    bucket = build_relative_position(x, x, bucket_size=8, max_position=MAX_POS)[0]
    scale = (10 * 3) ** -0.5
    for i, j in ((0, 0), (3, 11), (11, 2), (7, 8)):
        c = (r.q[:, :, i] * pos_k[:, int((bucket[i, j] + 8).clamp(0, 15))]).sum(-1) * scale
        p = (r.k[:, :, j] * pos_q[:, int((8 - bucket[j, i]).clamp(0, 15))]).sum(-1) * scale
        torch.testing.assert_close(r.c2p[:, :, i, j], c, rtol=0, atol=1e-5)
        torch.testing.assert_close(r.p2c[:, :, i, j], p, rtol=0, atol=1e-5)
    content = r.scores * scale
    torch.testing.assert_close(r.scaled, content + r.c2p + r.p2c, rtol=0, atol=1e-5)
    torch.testing.assert_close(r.weights, torch.softmax(r.scaled, -1), rtol=0, atol=1e-6)


def test_explain_and_state_dict() -> None:
    _, m = _pair("sdpa", True, 8, ("c2p", "p2c"))
    assert sorted(m.state_dict()) == sorted(MultiHeadAttention(E, H).state_dict())
    _, own = _pair("sdpa", False, 8, ("c2p", "p2c"))
    assert {"pos_key_proj.weight", "pos_query_proj.bias"} <= set(own.state_dict())
    x, keep, table = _inputs(8)
    with torch.no_grad(), dispatch.explain() as ex:
        m(x, key_padding_mask=keep, rel_embeddings=table, need_weights=False)
    assert "disentangled positions: c2p + p2c relative terms added to the scores" in str(ex)


def test_attend_packed_reads_each_sequences_corner() -> None:
    _, m = _pair("varlen", True, 8, ("c2p", "p2c"))
    x, keep, table = _inputs(8)
    packed = pack_padding_mask(keep)
    terms = m.relative_terms(table, 19, 19)
    with torch.no_grad():
        got = m.attend_packed(x[keep], packed, relative=terms)
        want, _ = m(x, key_padding_mask=keep, rel_embeddings=table, need_weights=False)
    torch.testing.assert_close(got, want[keep], rtol=0, atol=1e-6)


def test_refusals_name_what_came_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"disentangled must be a tuple of relative terms from "
                       r"\('c2p', 'p2c'\), got 'c2p'"):  # fmt: skip
        MultiHeadAttention(E, H, disentangled="c2p", max_relative_positions=8)
    with pytest.raises(ValueError, match=r"needs position_buckets > 0 or max_relative_positions "
                       r">= 1 .* got -1 and -1"):  # fmt: skip
        MultiHeadAttention(E, H, disentangled=("c2p",))
    with pytest.raises(ValueError, match=r"takes no num_kv_heads and no scale"):
        MultiHeadAttention(E, H, num_kv_heads=1, disentangled=("c2p",), position_buckets=8)
    _, m = _pair("math", True, 8, ("c2p", "p2c"))
    x, _, table = _inputs(8)
    with pytest.raises(ValueError, match=r"rel_embeddings must be the relative position table "
                       r"of shape \(16, 30\) .* got \(15, 30\)"):  # fmt: skip
        m(x, rel_embeddings=table[:15])
    with pytest.raises(ValueError, match=r"rel_embeddings must be .* got None"):
        m(x)
    with pytest.raises(ValueError, match=r"has disentangled positions .* attend\(\) and "
                       r"attend_packed\(\) take relative="):  # fmt: skip
        m.attend(x, PreparedMask())
    with pytest.raises(ValueError, match=r"rel_embeddings= was given, but this module has no "
                       r"disentangled positions"):  # fmt: skip
        MultiHeadAttention(E, H)(x, rel_embeddings=table)
    packed = pack_padding_mask(torch.ones(2, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"a packed call takes a window or disentangled "
                       r"positions, not both"):  # fmt: skip
        m.attend_packed(x.reshape(-1, E), packed, window=2,
                        relative=m.relative_terms(table, 19, 19))  # fmt: skip


def test_a_backend_without_relative_terms_refuses_them_by_name() -> None:
    register_backend(BackendSpec("plain", math_attention, returns_weights=True,
                                 takes=frozenset({"scale"})))  # fmt: skip
    try:
        _, m = _pair("plain", True, 8, ("c2p", "p2c"))
        x, _, table = _inputs(8)
        with pytest.raises(ValueError, match=r"backend 'plain' cannot add disentangled relative "
                           r"positions \(DeBERTa's content-to-position and position-to-content "
                           r"terms\), and this model has them; use backend 'varlen'"):  # fmt: skip
            m(x, rel_embeddings=table)
    finally:
        del BACKENDS["plain"]
