"""Weights packed once for MKL's GEMM (``BertModel.prepack``, ``bertattn.attention.prepack``).

The packed path must give what the unpacked one gives, up to float32 rounding measured against a
float64 baseline; run only at the row counts it was packed for and only where it changes nothing
but speed (no autograd graph to build, float32 on the CPU); follow in-place weight changes; and
leave nothing behind in the module (state_dict, deepcopy, pickling) or after the model is gone.
"""

from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
from tiny_bert import TINY
from tiny_bert import tiny_bertattn as _tiny

from bertattn import BertConfig, BertModel, MultiHeadAttention
from bertattn.attention import prepack as pp

pytestmark = pytest.mark.skipif(
    not pp.available(), reason="this torch build has no MKL packed GEMM (not an x86 MKL build)"
)


@pytest.fixture
def mkl_calls(monkeypatch):  # type: ignore[no-untyped-def]
    """Counts the GEMMs that ran through a pack (the real op still runs)."""
    calls: list[int] = []
    real = pp._mkl_linear

    def counting(x, packed, weight, bias, rows):  # type: ignore[no-untyped-def]
        calls.append(rows)
        return real(x, packed, weight, bias, rows)

    monkeypatch.setattr(pp, "_mkl_linear", counting)
    return calls


def _ids(batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch * 100 + length)
    return torch.randint(5, TINY["vocab_size"], (batch, length), generator=g)


def _max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).abs().max().item()


def test_prepacked_minilm_matches_the_float64_baseline(minilm_dir, mkl_calls):
    model = BertModel.from_pretrained(minilm_dir).eval()
    reference = copy.deepcopy(model).double()
    ids = torch.tensor([[101, 2054, 2003, 1996, 3007, 1997, 2605, 1029, 102]])
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        want = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        plain = model(input_ids=ids, attention_mask=mask).last_hidden_state
        model.prepack([9])
        packed = model(input_ids=ids, attention_mask=mask).last_hidden_state
    layers = model.config.num_hidden_layers
    assert mkl_calls == [9] * (4 * layers)  # qkv, out, fc_in, fc_out per layer (pooler: 1 row)
    baseline = _max_err(plain, want)
    assert 0 < baseline < 1e-3
    assert _max_err(packed, want) <= 2 * baseline
    # mkl_calls above proves the packed kernel ran; its output may equal the plain one bit for
    # bit (MKL picks the same microkernel for both on some CPUs, e.g. an AMD EPYC)


def test_only_the_packed_row_counts_use_the_packs(mkl_calls):
    model = _tiny().prepack([8, 12])
    assert pp.packed_counts(model) == (8, 12)
    with torch.inference_mode():
        model(_ids(2, 4))  # 8 rows
        model(_ids(1, 12))  # 12 rows
        assert sorted(set(mkl_calls)) == [8, 12]
        mkl_calls.clear()
        other = model(_ids(1, 9)).last_hidden_state  # 9 rows: not packed
        assert mkl_calls == []
        unpacked = _tiny()(_ids(1, 9)).last_hidden_state
    assert torch.equal(other, unpacked)


def test_a_packed_varlen_batch_counts_its_real_tokens(mkl_calls):
    model = _tiny()
    ids = _ids(2, 10)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 3:] = 0  # 13 real tokens of 20: auto packs this batch on the CPU
    model.prepack([13])
    with torch.inference_mode():
        out = model(ids, mask).last_hidden_state
        ref = _tiny()(ids, mask).last_hidden_state
    assert mkl_calls and set(mkl_calls) == {13}
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_a_weight_changed_in_place_is_packed_again(mkl_calls):
    model, twin = _tiny().prepack([6]), _tiny()
    ids = _ids(1, 6)
    with torch.inference_mode():
        before = model(ids).last_hidden_state
    for m in (model, twin):  # the same change on both: an optimizer step, a manual edit
        with torch.no_grad():
            m.encoder.layers[0].mlp.fc_in.weight.mul_(1.5)
            m.encoder.layers[1].attn.q_linear.weight.add_(0.2)  # a view of the fused q/k/v
    with torch.inference_mode():
        after, want = model(ids).last_hidden_state, twin(ids).last_hidden_state
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, want, rtol=0, atol=1e-5)
    mkl_calls.clear()
    model.load_state_dict(_tiny(seed=1).state_dict())  # copies into the same tensors
    with torch.inference_mode():
        loaded = model(ids).last_hidden_state
        want = _tiny(seed=1)(ids).last_hidden_state
    assert mkl_calls  # still packed, for the new values
    torch.testing.assert_close(loaded, want, rtol=0, atol=1e-5)


def test_autograd_runs_unpacked(mkl_calls):
    model = _tiny().prepack([5])
    ids = _ids(1, 5)
    out = model(ids).last_hidden_state  # grad enabled, parameters require grad
    assert mkl_calls == []
    out.sum().backward()
    assert model.encoder.layers[0].mlp.fc_in.weight.grad is not None
    with torch.no_grad():
        model(ids)
    assert mkl_calls


def test_a_moved_or_cast_model_runs_unpacked(mkl_calls):
    model = _tiny().prepack([5])
    model.double()
    assert pp.packed_counts(model) == ()
    with torch.inference_mode():
        out = model(_ids(1, 5)).last_hidden_state
    assert out.dtype == torch.float64 and mkl_calls == []


def test_empty_counts_drop_the_packs(mkl_calls):
    model = _tiny().prepack([5])
    assert pp.prepack(model, []) == 0
    assert pp.packed_counts(model) == ()
    with torch.inference_mode():
        model(_ids(1, 5))
    assert mkl_calls == []


def test_the_packs_go_with_the_model():
    gc.collect()
    before = len(pp._PACKS)
    model = _tiny().prepack([4, 5])
    assert len(pp._PACKS) == before + 9  # 2 x (qkv, out, fc_in, fc_out) + pooler
    del model
    gc.collect()
    assert len(pp._PACKS) == before


def test_the_module_carries_nothing_of_the_packs(mkl_calls):
    model = _tiny()
    keys = list(model.state_dict())
    model.prepack([5])
    assert list(model.state_dict()) == keys
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    ids = _ids(1, 5)
    with torch.inference_mode():
        outs = [m(ids).last_hidden_state for m in (model, clone, loaded)]
    assert len(mkl_calls) == 8  # the original only: copies have new tensors, without packs
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-5)
    assert torch.equal(outs[1], outs[2])


def test_a_standalone_attention_module_can_be_packed(mkl_calls):
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 3, 32)
    with torch.inference_mode():
        ref = attn(x)[0]
        pp.prepack(attn, [6])
        out = attn(x)[0]
    assert mkl_calls == [6, 6]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "counts, message",
    [
        ([0], "ints >= 1"),
        ([-3], "ints >= 1"),
        (["9"], "ints >= 1"),
        ([True], "ints >= 1"),
        (9, "an iterable of row counts"),
        (range(1, 18), "at most 16"),
    ],
)
def test_bad_token_counts_are_refused(counts, message):
    model = _tiny()
    with pytest.raises(ValueError, match=message):
        model.prepack(counts)
    assert pp.packed_counts(model) == ()


def test_weights_that_cannot_be_packed_are_refused():
    with pytest.raises(ValueError, match="float32 weights on the CPU.*bfloat16"):
        _tiny().to(torch.bfloat16).prepack([4])
    with pytest.raises(ValueError, match="float32 weights on the CPU.*bfloat16"):
        _tiny().to_compute_dtype(torch.bfloat16).prepack([4])
    with torch.inference_mode():
        model = BertModel(BertConfig(**TINY)).eval()
    with pytest.raises(ValueError, match="inference_mode"):
        model.prepack([4])


def test_without_mkl_prepack_warns_and_packs_nothing(monkeypatch, mkl_calls):
    monkeypatch.setattr(pp, "available", lambda: False)
    model = _tiny()
    with pytest.warns(RuntimeWarning, match="no MKL packed GEMM"):
        assert pp.prepack(model, [5]) == 0
    with torch.inference_mode():
        model(_ids(1, 5))
    assert mkl_calls == []
