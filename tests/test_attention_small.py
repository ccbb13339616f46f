"""Small batched attention on the CPU (bertattn.attention.small): ``auto`` runs math instead of
fused SDPA for calls of several short sequences only where math was timed faster (or asked
for), per intra-op thread count; the outputs are the same either way, explain() says which ran
and why, and math's in-place scaling changes no value."""

from __future__ import annotations

import pytest
import torch
import transformers

import bertattn
from bertattn import BertModel
from bertattn.attention import small
from bertattn.attention.backends import math_attention
from bertattn.attention.dispatch import choose_backend
from bertattn.attention.steps import record_steps


@pytest.fixture
def fresh(monkeypatch):
    """The choices made again in this test, and again after it."""
    monkeypatch.delenv(small.ENV, raising=False)
    small.reset()
    yield monkeypatch
    small.reset()


def _auto(batch, key_len=16, *, dtype=torch.float32, device="cpu", training=False):
    return choose_backend(
        "auto",
        need_weights=False,
        device_type=device,
        dtype=dtype,
        key_len=key_len,
        training=training,
        batch=batch,
    )


def test_asked_math_runs_for_small_batched_calls_only(fresh):
    fresh.setenv(small.ENV, "math")
    name, why = _auto(8)
    assert name == "math"
    assert "8 sequences of <= 32 keys" in why and f"{small.ENV}=math" in why
    assert _auto(8, key_len=32)[0] == "math"
    # outside the small batched CPU float32 calls the table's choice stands
    assert _auto(1)[0] == "sdpa"  # one sequence: SDPA was faster
    assert _auto(None)[0] == "sdpa"  # a caller that does not say its batch
    assert _auto(8, key_len=33)[0] == "sdpa"
    assert _auto(8, dtype=torch.bfloat16)[0] == "sdpa"
    assert _auto(8, device="cuda")[0] == "sdpa"
    assert _auto(8, training=True)[0] == "sdpa"  # dropout: fused SDPA
    # weights asked for, or a backend asked for, are never overridden
    assert choose_backend("sdpa", need_weights=False, key_len=16, batch=8)[0] == "sdpa"


def test_asked_sdpa_keeps_sdpa(fresh):
    fresh.setenv(small.ENV, "sdpa")
    name, why = _auto(8)
    assert name == "sdpa" and "small" not in why


def test_a_bad_setting_is_refused_with_the_choices(fresh):
    fresh.setenv(small.ENV, "flash")
    with pytest.raises(ValueError, match=r"BERTATTN_SMALL_ATTENTION='flash' is not one of auto, "):
        _auto(8)


@pytest.mark.parametrize(
    ("times", "math_chosen"),
    [
        # (sdpa, math) seconds per timed call, at 8 keys then at 32 keys
        ([(2.0, 1.0), (2.0, 1.0)], True),
        ([(1.5, 1.0), (1.05, 1.0)], False),  # faster at 8 keys only: not taken
        ([(1.0, 2.0), (1.0, 2.0)], False),
    ],
)
def test_the_timed_choice_needs_the_margin_at_both_lengths(fresh, times, math_chosen):
    scripted = [t for pair in times for t in pair]
    fresh.setattr(small, "_best", lambda fn: scripted.pop(0))
    chosen, why = small.choice()
    assert chosen is math_chosen
    assert not scripted  # both kernels timed at both lengths
    ratios = [f"{s / m:.2f}x" for s, m in times]
    assert f"math {ratios[0]} / {ratios[1]} the speed of fused SDPA" in why
    assert ("math is used from 1.15x" in why) is not math_chosen
    assert (_auto(8)[0] == "math") is math_chosen


def test_decided_once_per_thread_count(fresh):
    calls: list[int] = []

    def measure(threads):
        calls.append(threads)
        return threads == 2, f"scripted for {threads}"

    fresh.setattr(small, "_measure", measure)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _auto(8)[0] == "math"
        assert _auto(16)[0] == "math"
        torch.set_num_threads(1)
        assert _auto(8)[0] == "sdpa"
        torch.set_num_threads(2)
        assert _auto(8)[0] == "math"
    finally:
        torch.set_num_threads(before)
    assert calls == [2, 1]


@pytest.mark.parametrize("asked", ["math", "sdpa"])
def test_the_model_matches_transformers_with_either_kernel(fresh, tiny_checkpoint, asked):
    fresh.setenv(small.ENV, asked)
    hf = transformers.BertModel.from_pretrained(tiny_checkpoint, attn_implementation="eager")
    hf = hf.eval().double()
    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 90, (6, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0  # little padding: the padded path, not packing
    with torch.no_grad(), bertattn.explain() as log:
        got = model(ids, attention_mask=mask).last_hidden_state
        want = hf(ids, attention_mask=mask).last_hidden_state.float()
    ran = {r.backend for r in log.records}
    assert ran == {asked}
    if asked == "math":
        assert all("6 sequences of <= 32 keys" in r.reason for r in log.records)
    real = mask.bool()
    # the float64 model is the baseline: float32 rounding of a few layers, either kernel
    assert torch.allclose(got[real], want[real], rtol=1e-4, atol=1e-5)


def test_in_place_scaling_changes_no_value():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(3, 4, 9, 8, generator=g) for _ in range(3))
    bias = torch.zeros(3, 1, 1, 9)
    bias[0, ..., 6:] = float("-inf")
    lean, lean_w = math_attention(q, k, v, bias, dropout_p=0.0, need_weights=True)
    with record_steps() as rec:  # recording keeps every step's own tensor (out of place)
        steps, steps_w = math_attention(q, k, v, bias, dropout_p=0.0, need_weights=True)
    assert len(rec.records) == 1
    assert torch.equal(lean, steps) and torch.equal(lean_w, steps_w)
    # the recorded raw scores are not the scaled ones: nothing was overwritten
    r = rec.records[0]
    assert torch.equal(r.scores, q @ k.transpose(-2, -1))
    assert torch.allclose(r.scaled, r.scores / 8**0.5)


def test_math_keeps_its_graph_and_other_bias_dtypes():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, requires_grad=True) for _ in range(3))
    out, _ = math_attention(q, k, v, None, dropout_p=0.0, need_weights=False)
    out.sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = torch.softmax(q2 @ k2.transpose(-2, -1) / 2.0, dim=-1) @ v2
    ref.sum().backward()
    assert torch.allclose(out, ref) and torch.allclose(q.grad, q2.grad)
    # a float64 bias: the sum is promoted as before (not squeezed into the float32 buffer)
    x = torch.randn(1, 1, 3, 4, generator=g)
    bias = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    bias[..., 2] = -0.3
    with torch.no_grad():
        out, w = math_attention(x, x, x, bias, dropout_p=0.0, need_weights=True)
    promoted = torch.softmax(x @ x.transpose(-2, -1) / 2.0 + bias, dim=-1)  # float64
    assert torch.equal(w, promoted.float())
    assert torch.equal(out, promoted.float() @ x)
