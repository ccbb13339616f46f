"""The measured dispatch policy (attention/policy.py) and the lean hot path around it: ``auto``
follows the table, memoized checks never hide an error, records are the same when built lazily."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import bertattn
from bertattn.attention import fastcall, policy
from bertattn.attention.dispatch import VARLEN_MIN_PAD_FRACTION, choose_backend
from bertattn.attention.masks import prepare_mask

E, H = 16, 4
X = torch.randn(2, 5, E)


def _with(kernel: str = "sdpa", varlen: float | None = 0.1, size: str = "*") -> tuple:
    """The default table with a first rule for CPU float32 of ``size``."""
    return (policy.Rule("cpu", "float32", size, kernel, varlen, "test"), *policy.TABLE)


def test_default_table_covers_every_cpu_fp32_size_class_and_keeps_the_cuda_rule() -> None:
    for name, top in policy.SIZE_CLASSES:
        rule = policy.lookup("cpu", torch.float32, min(top, 10_000))
        assert rule.device == "cpu" and rule.dtype == "float32" and rule.size == name
        assert rule.kernel in ("math", "sdpa")
    cuda = policy.lookup("cuda", torch.bfloat16, 128)
    assert cuda.kernel == "sdpa" and cuda.varlen_min_pad is None and "H200" in cuda.source
    assert policy.lookup("cpu", torch.bfloat16, 128).source.startswith("not measured")
    assert policy.lookup("cpu", "float32", 128).varlen_min_pad == VARLEN_MIN_PAD_FRACTION
    assert [policy.size_class(n) for n in (1, 32, 33, 128, 129, 512, 513, 10**6)] == [
        "tiny", "tiny", "short", "short", "medium", "medium", "long", "long"
    ]


def test_auto_follows_a_table_override() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    with torch.no_grad():
        ref, _ = m(X, need_weights=False)
        with policy.use_table(_with("math", size="tiny")), bertattn.explain() as log:
            out, w = m(X, need_weights=False)
        assert w is None
        assert log.backends() == ["math"]
        assert "policy: cpu float32 tiny" in log.records[0].reason
        assert m.last_dispatch.backend == "math"
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)  # math == sdpa
        with bertattn.explain() as after:  # the block restored the table
            m(X, need_weights=False)
    assert after.backends() == ["sdpa"]


def test_auto_follows_a_monkeypatched_table(monkeypatch: pytest.MonkeyPatch) -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    kpm = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        ref, _ = m(X, key_padding_mask=kpm, need_weights=False)  # memoized as sdpa
        monkeypatch.setattr(policy, "TABLE", _with("math"))
        with bertattn.explain() as log:
            out, _ = m(X, key_padding_mask=kpm, need_weights=False)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert log.backends() == ["math"]
    assert choose_backend("auto", need_weights=False, dtype=torch.float32, key_len=5) == (
        "math",
        log.records[0].reason,
    )
    # another size class, or dtype, is not covered by the rule
    assert choose_backend("auto", need_weights=False, dtype=torch.float64, key_len=5)[0] == "sdpa"


def test_training_with_dropout_keeps_fused_sdpa() -> None:
    m = bertattn.MultiHeadAttention(E, H, dropout=0.1).train()
    with policy.use_table(_with("math")), bertattn.explain() as log:
        m(X, need_weights=False)
        m.eval()
        m(X, need_weights=False)
    assert log.backends() == ["sdpa", "math"]


def test_varlen_threshold_comes_from_the_table() -> None:
    with policy.use_table(_with(varlen=0.5)):
        # without a dtype the CPU catch-all rule applies (10%)
        assert choose_backend("auto", need_weights=False, pad_fraction=0.3)[0] == "varlen"
        name, why = choose_backend(
            "auto", need_weights=False, pad_fraction=0.3, dtype=torch.float32, key_len=8
        )
        assert name == "sdpa" and "below 50%" in why
        assert choose_backend(
            "auto", need_weights=False, pad_fraction=0.6, dtype=torch.float32, key_len=8
        )[0] == "varlen"
    with policy.use_table(_with(varlen=None)):
        name, why = choose_backend(
            "auto", need_weights=False, pad_fraction=0.9, dtype=torch.float32, key_len=8
        )
        assert name == "sdpa" and "never packs" in why


def test_bert_model_packs_by_the_table() -> None:
    cfg = bertattn.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = bertattn.BertModel(cfg).eval()
    ids = torch.randint(5, 99, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])  # 3/16 = 19% padding
    with torch.no_grad():
        with bertattn.explain() as log:
            packed = model(ids, mask).last_hidden_state
        assert set(log.backends()) == {"varlen"}
        with policy.use_table(_with(varlen=0.25)), bertattn.explain() as log:
            padded = model(ids, mask).last_hidden_state
        assert set(log.backends()) == {"sdpa"}
    real = mask.bool()
    torch.testing.assert_close(packed[real], padded[real], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------- memos hide no error
def test_a_memoized_case_still_raises_for_the_next_bad_input() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    m(X, need_weights=False)
    m(X, need_weights=False)  # memoized
    with pytest.raises(ValueError, match="has dtype torch.float64 but the module's weights"):
        m(X.double(), need_weights=False)
    with pytest.raises(ValueError, match="has width 8"):
        m(torch.randn(2, 5, 8), need_weights=False)
    with pytest.raises(ValueError, match="cannot broadcast"):
        m(X, mask=torch.ones(3, 5, 5), need_weights=False)
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\)"):
        m(X, key_padding_mask=torch.ones(2, 4), need_weights=False)
    with pytest.raises(ValueError, match="key_value has batch size 3 but x has 2"):
        m(X, key_value=torch.randn(3, 5, E), need_weights=False)
    with pytest.raises(ValueError, match="key_value must be a torch.Tensor"):
        m(X, key_value=[1.0], need_weights=False)
    m.to(torch.float64)  # the weights' dtype is part of the case
    with pytest.raises(ValueError, match="has dtype torch.float32 but the module's weights"):
        m(X, need_weights=False)
    m.backend = "nope"
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        m(X.double(), need_weights=False)


def test_padding_fast_path_equals_the_general_form() -> None:
    kpm = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 1, 1, 1]])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        fast = prepare_mask(
            key_padding_mask=kpm, batch=2, heads=H, query_len=5, key_len=5, dtype=dtype,
            device=torch.device("cpu"),
        )
        general = prepare_mask(
            mask=kpm[:, None, None, :], batch=2, heads=H, query_len=5, key_len=5, dtype=dtype,
            device=torch.device("cpu"),
        )
        assert fast.live_rows is None and general.live_rows is None
        assert fast.bias.dtype == general.bias.dtype and fast.bias.shape == general.bias.shape
        assert torch.equal(fast.bias, general.bias)
    dead = prepare_mask(  # a row of padding only: the general path zeroes it
        key_padding_mask=torch.tensor([[0, 0, 0], [1, 0, 1]]), batch=2, heads=H, query_len=3,
        key_len=3, dtype=torch.float32, device=torch.device("cpu"),
    )
    assert dead.live_rows is not None and dead.live_rows.flatten().tolist() == [False, True]
    assert torch.isfinite(dead.bias[0]).all()


# ---------------------------------------------------------------------- lazy records, hooks
def test_last_dispatch_is_built_lazily_and_equal_to_the_record() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    assert m.last_dispatch is None
    m(X, need_weights=False)
    first = m.last_dispatch
    assert isinstance(first, bertattn.Dispatch)
    assert first == bertattn.Dispatch(
        "auto", "sdpa", "no weights needed: fused scaled_dot_product_attention",
        (2, H, 5, E // H), "float32",
    )
    assert m.last_dispatch is first  # built once
    with bertattn.explain() as log:
        m(X)
    assert m.last_dispatch is log.records[0]
    m.last_dispatch = None
    assert m.last_dispatch is None
    assert dataclasses.asdict(log.records[0])["backend"] == "math"


def test_hooks_on_the_output_projection_still_run() -> None:
    m = bertattn.MultiHeadAttention(E, H).eval()
    seen = []
    handle = m.out_linear.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    try:
        m(X, need_weights=False)
    finally:
        handle.remove()
    assert seen == [torch.Size([2, 5, E])]
    assert fastcall.plain_call(m.out_linear)
    g = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert not fastcall.plain_call(m.out_linear)
    finally:
        g.remove()
