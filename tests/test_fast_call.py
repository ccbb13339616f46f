"""MultiHeadAttention's fast call (bertattn.attention.fastcall.self_attention): the commonest
module call (inference, no weights, at most a key padding mask, fused SDPA) computed with less
Python, the same bits as the general path, within the eager path's error of the float64 math
reference, and never taken where the general path would do something else."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bertattn
from bertattn.attention import fastcall, policy
from bertattn.attention.steps import record_steps


@pytest.fixture
def counted(monkeypatch):
    """How many module calls the fast path answered."""
    seen = {"fast": 0}
    real = fastcall.self_attention

    def spy(mod, x, kpm):
        out = real(mod, x, kpm)
        seen["fast"] += out is not None
        return out

    monkeypatch.setattr(fastcall, "self_attention", spy)
    return seen


def _module(e: int, h: int, seed: int = 0) -> bertattn.MultiHeadAttention:
    torch.manual_seed(seed)
    return bertattn.MultiHeadAttention(e, h, dropout=0.1).eval()


def _general(mod, *args, **kwargs):
    """The same call through the general path."""
    fastcall.FAST_CALL = False
    try:
        return mod(*args, **kwargs)
    finally:
        fastcall.FAST_CALL = True


def _padding(b: int, length: int, lengths: list[int]) -> torch.Tensor:
    return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]  # (B, L) True = real


CASES = [  # (E, H): head sizes 32 and 64
    (64, 2),
    (128, 2),
    (384, 12),
    (768, 12),
]


@pytest.mark.parametrize(("e", "h"), CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_same_bits_as_the_general_path_and_within_the_eager_error(counted, e, h, padded):
    mod = _module(e, h)
    b, length = 3, 19
    x = torch.randn(b, length, e, generator=torch.Generator().manual_seed(1))
    kpm = _padding(b, length, [19, 11, 0]) if padded else None  # row 2: no key at all
    with torch.inference_mode():
        fast, w = mod(x, key_padding_mask=kpm, need_weights=False)
        assert counted["fast"] == 1 and w is None
        general, _ = _general(mod, x, key_padding_mask=kpm, need_weights=False)
        assert counted["fast"] == 1  # (the general call did not take it)
    torch.testing.assert_close(fast, general, atol=0, rtol=0)
    # against the math reference in float64 (the eager path's own error as the yardstick)
    ref = _module(e, h).double()
    ref.backend = "math"
    eager = _module(e, h)
    eager.backend = "math"
    with torch.no_grad():
        want, _ = ref(x.double(), key_padding_mask=kpm, need_weights=False)
        plain, _ = eager(x, key_padding_mask=kpm, need_weights=False)
    err_fast = (fast.double() - want).abs().max().item()
    err_eager = (plain.double() - want).abs().max().item()
    assert err_fast <= 2 * err_eager + 1e-6, (err_fast, err_eager)
    if padded:  # the fully masked row: zero context, so the output projection's bias alone
        bias = mod.out_linear.bias.detach()
        torch.testing.assert_close(fast[2], bias.expand(length, e), atol=0, rtol=0)


def test_the_record_and_explain_say_what_ran(counted):
    mod = _module(64, 2)
    x = torch.randn(2, 8, 64)
    with torch.inference_mode(), bertattn.explain() as log:
        mod(x, need_weights=False)
    assert counted["fast"] == 1
    assert log.backends() == ["sdpa"]
    assert mod.last_dispatch.backend == "sdpa" and mod.last_dispatch.shape == (2, 2, 8, 32)
    with torch.inference_mode():
        _general(mod, x, need_weights=False)
    assert mod.last_dispatch.reason == log.records[0].reason


def _cases_left_to_the_general_path():
    x = torch.randn(2, 8, 64)
    kpm = _padding(2, 8, [8, 5])

    def training(m):
        m.train()
        return m(x, need_weights=False)

    def hooked(m):
        m.out_linear.register_forward_hook(lambda *a: None)
        return m(x, need_weights=False)

    def unpacked(m):
        with torch.no_grad():
            m.q_linear.weight = nn.Parameter(m.q_linear.weight.clone())  # a new storage
        return m(x, need_weights=False)

    def math_table(m):
        rows = tuple(
            policy.Rule("cpu", "float32", r.size, "math", r.varlen_min_pad, "test")
            if r.device == "cpu" and r.dtype == "float32"
            else r
            for r in policy.TABLE
        )
        with policy.use_table(rows):
            return m(x, need_weights=False)

    def steps(m):
        with record_steps():
            return m(x, need_weights=False)

    return {
        "weights asked for": lambda m: m(x, need_weights=True),
        "a mask": lambda m: m(x, torch.ones(8, 8), need_weights=False),
        "an attn_bias": lambda m: m(x, attn_bias=torch.zeros(8, 8), need_weights=False),
        "cross-attention": lambda m: m(x, key_value=x, need_weights=False),
        "unbatched": lambda m: m(x[0], need_weights=False),
        "varlen asked for": lambda m: (
            setattr(m, "backend", "varlen"),
            m(x, key_padding_mask=kpm, need_weights=False),
        )[1],
        "math asked for": lambda m: (setattr(m, "backend", "math"), m(x, need_weights=False))[1],
        "training": training,
        "a hook on out_linear": hooked,
        "q/k/v out of their fused storage": unpacked,
        "a policy table choosing math": math_table,
        "steps recorded": steps,
    }


@pytest.mark.parametrize("case", list(_cases_left_to_the_general_path()))
def test_left_to_the_general_path(counted, case):
    call = _cases_left_to_the_general_path()[case]
    with torch.inference_mode():
        got = call(_module(64, 2))
        fastcall.FAST_CALL = False
        try:
            want = call(_module(64, 2))
        finally:
            fastcall.FAST_CALL = True
    assert counted["fast"] == 0
    if case != "training":  # (dropout draws differ between two calls)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)


def test_autograd_takes_the_general_path(counted):
    mod = _module(64, 2)
    x = torch.randn(2, 8, 64, requires_grad=True)
    out, _ = mod(x, need_weights=False)
    out.sum().backward()
    assert counted["fast"] == 0 and x.grad is not None
    assert mod.q_linear.weight.grad is not None  # gradients reach the q/k/v parameters


def test_wrong_arguments_raise_as_before():
    mod = _module(64, 2)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="width 32"):
            mod(torch.randn(1, 4, 32), need_weights=False)
        with pytest.raises(ValueError, match="dtype torch.float64"):
            mod(torch.randn(1, 4, 64, dtype=torch.float64), need_weights=False)
        with pytest.raises(ValueError):
            mod(torch.randn(1, 4, 64), key_padding_mask=torch.ones(1, 5), need_weights=False)
