"""torch.compile(fullgraph=True): no graph break, same outputs as eager, and no recompile per
sequence length, for MultiHeadAttention (math, sdpa) and BertModel. varlen's limits, pinned."""

from __future__ import annotations

import pytest
import torch
from tiny_bert import TINY as TINY_BERT
from torch._dynamo.testing import CompileCounter

import bertattn
from bertattn import BertConfig, BertModel, MultiHeadAttention

# torch's inductor import itself uses torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

LENGTHS = [5, 9, 17, 33, 64]  # never equal to the batch size (3): duck sizing would tie them
TINY = BertConfig(**TINY_BERT)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # the process's library for float32 products (bertattn.attention.gemm), decided now if no
    # product ran before in this process: a graph guards on that decision, so one made by the
    # first eager call in a test would recompile what the test counts (the file run first, or
    # alone, saw 2 compilations for 1)
    from bertattn.attention import gemm

    gemm.choices()
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mask(length: int) -> torch.Tensor:
    """(3, L): full, half padding, all padding (a dead row)."""
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, length // 2 :] = 0
    mask[2] = 0
    return mask


def _random_bert(backend: str) -> BertModel:
    torch.manual_seed(0)
    model = BertModel(TINY, backend=backend).eval()
    with torch.no_grad():  # LayerNorms away from identity
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return model


@pytest.mark.parametrize(
    "backend, need_weights", [("math", False), ("math", True), ("sdpa", False)]
)
def test_attention_fullgraph_dynamic(backend, need_weights):
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, backend=backend).eval()
    counter = CompileCounter()
    compiled = torch.compile(module, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for length in LENGTHS:
            x = torch.randn(3, length, 32)
            kw = dict(key_padding_mask=_mask(length), need_weights=need_weights)
            got, got_w = compiled(x, **kw)
            want, want_w = module(x, **kw)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
            if need_weights:
                torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-5)
                assert got_w[2].abs().max() == 0  # the dead row: zero weights, no NaN
    assert counter.frame_count <= 2, f"{counter.frame_count} compilations for 5 lengths"
    assert counter.frame_count == 1  # measured: one dynamic graph serves every length


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_bert_fullgraph_dynamic(backend):
    model = _random_bert(backend)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for length in LENGTHS:
            ids = torch.randint(1, 99, (3, length))
            got, want = compiled(ids, _mask(length)), model(ids, _mask(length))
            assert not got.last_hidden_state.isnan().any()
            # eager auto may pack the batch (varlen: zeros at padding); a traced graph never
            # packs, so padding positions are compared only where both computed them
            real = _mask(length).bool()
            torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real])
            first_real = real[:, 0]  # an all-padding row has no [CLS] to pool
            torch.testing.assert_close(
                got.pooler_output[first_real], want.pooler_output[first_real]
            )
    assert counter.frame_count == 1


@pytest.mark.slow
def test_bert_default_compile_goes_dynamic_after_one_recompile():
    """Without dynamic=True, torch compiles the first shape statically and the second one
    dynamically ("automatic dynamic shapes"); after that no length recompiles."""
    model = _random_bert("auto")
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for length in LENGTHS:
            ids = torch.randint(1, 99, (3, length))
            torch.testing.assert_close(
                compiled(ids, _mask(length), output_attentions=[1]).attentions[1],
                model(ids, _mask(length), output_attentions=[1]).attentions[1],
            )
    assert counter.frame_count <= 2


def test_compiled_calls_record_no_dispatch():
    module = MultiHeadAttention(32, 4, backend="sdpa").eval()
    compiled = torch.compile(module, backend=CompileCounter(), fullgraph=True, dynamic=True)
    with torch.no_grad(), bertattn.explain() as log:
        compiled(torch.randn(3, 5, 32), need_weights=False)
    assert log.records == []  # a compiled graph replays one decision; eager calls record it


@pytest.mark.slow
def test_varlen_cannot_compile_fullgraph_but_compiles_with_breaks():
    """varlen packs with offsets read from the mask (nonzero, .tolist(), a Python loop over
    sequences): data-dependent, so fullgraph=True fails; with graph breaks it runs, correct,
    and the breaks do not recompile per length."""
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, backend="varlen").eval()
    x, mask = torch.randn(3, 5, 32), _mask(5)
    full = torch.compile(module, backend=CompileCounter(), fullgraph=True, dynamic=True)
    with torch.no_grad(), pytest.raises(Exception, match="data-dependent|Dynamic shape operator"):
        full(x, key_padding_mask=mask, need_weights=False)
    torch._dynamo.reset()
    counter = CompileCounter()
    broken = torch.compile(module, backend=counter, dynamic=True)
    frames = []
    with torch.no_grad():
        for length in LENGTHS:
            x = torch.randn(3, length, 32)
            kw = dict(key_padding_mask=_mask(length), need_weights=False)
            torch.testing.assert_close(broken(x, **kw)[0], module(x, **kw)[0])
            frames.append(counter.frame_count)
    assert frames[0] > 1 and frames[-1] == frames[0]


@pytest.mark.slow
def test_inductor_bert_matches_eager():
    model = _random_bert("sdpa")
    compiled = torch.compile(model, fullgraph=True, dynamic=True)  # inductor
    with torch.no_grad():
        for length in (7, 30):
            ids = torch.randint(1, 99, (3, length))
            got, want = compiled(ids, _mask(length)), model(ids, _mask(length))
            torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
