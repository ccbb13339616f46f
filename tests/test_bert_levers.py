"""The feed-forward block's two fewer passes (BertMLP.forward_residual): the GELU in place and
the residual folded into the second product, in inference on the CPU where MKL computes it.
Within the eager path's error of a float64 math reference at head sizes 32 and 64, padded,
packed and with a text of no tokens; the plain ops wherever the fold must not run."""

from __future__ import annotations

import pytest
import torch
from tiny_bert import TINY

from bertattn import BertConfig, BertModel
from bertattn.attention import gemm
from bertattn.families import bert_layers as model_mod


def _model(hidden: int, heads: int, backend: str = "auto", seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    cfg = BertConfig(
        **{**TINY, "hidden_size": hidden, "num_attention_heads": heads, "intermediate_size": 96}
    )
    model = BertModel(cfg, backend=backend).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _batch(padded: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, TINY["vocab_size"], (4, 21), generator=g)
    if not padded:
        return ids, None
    mask = torch.ones(4, 21, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 3:] = 0
    return ids, mask


@pytest.fixture
def folds(monkeypatch):
    """How many feed-forward blocks ran the fold (its addmm_ onto ``x + bias``)."""
    seen = {"n": 0}
    real = model_mod.BertMLP.forward_residual

    def spy(self, x):
        before = model_mod.residual_add
        calls = {"plain": 0}

        def counting(a, b):
            calls["plain"] += 1
            return before(a, b)

        model_mod.residual_add = counting
        try:
            out = real(self, x)
        finally:
            model_mod.residual_add = before
        seen["n"] += calls["plain"] == 0
        return out

    monkeypatch.setattr(model_mod.BertMLP, "forward_residual", spy)
    return seen


def _run(model: BertModel, ids, mask, fold: bool = True) -> torch.Tensor:
    before = model_mod.FOLD_RESIDUAL
    model_mod.FOLD_RESIDUAL = fold
    try:
        with torch.inference_mode():
            return model(ids, mask).last_hidden_state
    finally:
        model_mod.FOLD_RESIDUAL = before


@pytest.mark.parametrize(("hidden", "heads"), [(64, 2), (128, 2)])  # head sizes 32 and 64
@pytest.mark.parametrize(("backend", "padded"), [("auto", True), ("sdpa", True), ("auto", False)])
def test_within_the_eager_error_of_a_float64_reference(folds, hidden, heads, backend, padded):
    gemm.reset()  # (this suite's rule: MKL on this CPU unless the CPU is an AMD with AVX-512)
    model = _model(hidden, heads, backend)
    ids, mask = _batch(padded)
    folded = _run(model, ids, mask)
    if gemm.choice() == "mkl":
        assert folds["n"] == model.config.num_hidden_layers
    plain = _run(model, ids, mask, fold=False)
    ref = _model(hidden, heads, "math").double()
    with torch.inference_mode():
        want = ref(ids, mask).last_hidden_state
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    err_fold = (folded.double() - want)[real].abs().max().item()
    err_plain = (plain.double() - want)[real].abs().max().item()
    assert err_fold <= 2 * err_plain + 1e-6, (err_fold, err_plain)


def test_a_text_of_no_tokens_and_a_packed_batch(folds):
    """A row whose mask is all zeros (no key for any query) next to real ones, packed by
    ``auto``: the real rows as the plain path gives them, within rounding."""
    model = _model(64, 2)
    ids, mask = _batch(True)
    mask[3] = 0
    folded = _run(model, ids, mask)
    plain = _run(model, ids, mask, fold=False)
    real = mask.bool()
    torch.testing.assert_close(folded[real], plain[real], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(folded).all()


def test_not_with_autograd_nor_where_onednn_computes_the_product(folds, monkeypatch):
    model = _model(64, 2)
    ids, mask = _batch(True)
    out = model(ids, mask).last_hidden_state  # autograd on: the plain ops
    out.sum().backward()
    assert folds["n"] == 0
    assert model.encoder.layers[0].mlp.fc_out.weight.grad is not None
    if gemm._onednn_op() is not None and torch.backends.mkldnn.is_available():
        monkeypatch.setenv(gemm.ENV, "onednn")
        gemm.reset()
        try:
            got = _run(model, ids, mask)
            want = _run(model, ids, mask, fold=False)
        finally:
            gemm.reset()
        assert folds["n"] == 0  # oneDNN's product (bias and GELU inside it) is kept
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_hooked_block_runs_the_plain_ops(folds):
    model = _model(64, 2)
    seen = []
    model.encoder.layers[0].mlp.fc_in.register_forward_hook(lambda m, i, o: seen.append(o.clone()))
    ids, mask = _batch(True)
    _run(model, ids, mask)
    assert seen and folds["n"] == model.config.num_hidden_layers - 1  # the other layer folds
    # what the hook saw is fc_in's output before the GELU (not overwritten in place)
    assert (seen[0] < 0).any()


def test_not_under_autocast(folds):
    """Under ``torch.autocast`` the products run in bfloat16: the plain ops, as before."""
    model = _model(64, 2)
    ids, mask = _batch(True)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(ids, mask).last_hidden_state
    assert folds["n"] == 0 and torch.isfinite(got).all()
