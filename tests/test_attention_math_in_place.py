"""The math backend's in-place scaling (when nothing records the steps and no graph is built)
changes no value: the same outputs and weights bit for bit as the step-by-step path, the recorded
steps untouched, gradients through the out-of-place path, a bias of another dtype promoted."""

from __future__ import annotations

import torch

from bertattn.attention.backends import math_attention
from bertattn.attention.steps import record_steps


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
