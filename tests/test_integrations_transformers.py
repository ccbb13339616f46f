"""``attn_implementation="bertattn"`` in Hugging Face transformers, checked against transformers'
own ``sdpa`` and ``eager`` implementations (bertattn.integrations.transformers).

Fast tier: the attention function called directly on random tensors, and the tiny random
checkpoint. Slow tier: the real all-MiniLM-L6-v2 on a padded batch of texts.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tiny_bert import TINY  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.models.bert.modeling_bert import eager_attention_forward  # noqa: E402

import bertattn  # noqa: E402
import bertattn.integrations.transformers as bt  # noqa: E402

TEXTS = [
    "Hello world.",
    "The attention mask must keep every padding token out of the softmax, in every layer.",
    "A sentence of middling length.",
    "Short one",
]


# ---------------------------------------------------------------------- helpers
@pytest.fixture
def scratch_names():
    """Names registered by a test, removed from both registries afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        AttentionInterface._global_mapping.pop(name, None)
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)


def layer(heads: int = 4, *, is_causal: bool = False, groups: int = 1, training: bool = False):
    """A stand-in for a transformers attention layer: what the attention function reads."""
    module = torch.nn.Module()
    module.is_causal = is_causal
    module.num_key_value_groups = groups
    module.train(training)
    return module


def qkv(b=3, h=4, lq=7, lk=7, d=8, hkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, hkv or h, lk, d, generator=g)
    v = torch.randn(b, hkv or h, lk, d, generator=g)
    return q, k, v


def padding_keep(lengths: list[int], lq: int, lk: int) -> torch.Tensor:
    """transformers' bidirectional mask for a padded batch: bool (B, 1, Lq, Lk), True = attend."""
    real = torch.arange(lk)[None, :] < torch.tensor(lengths)[:, None]  # (B, Lk)
    return real[:, None, None, :].expand(len(lengths), 1, lq, lk)


def tiny_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[0, 4:] = 0
    mask[2, 8:] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


# ---------------------------------------------------------------------- registration
def test_import_registers_attention_and_mask_function_together():
    assert ALL_ATTENTION_FUNCTIONS["bertattn"] is bt.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["bertattn"] is bt.mask_forward
    assert "bertattn" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping  # what transformers reads


def test_register_again_and_reimport_are_harmless(tiny_checkpoint):
    model = transformers.BertModel.from_pretrained(tiny_checkpoint, attn_implementation="bertattn")
    batch = tiny_batch()
    with torch.no_grad():
        before = model(**batch).last_hidden_state
        fn = ALL_ATTENTION_FUNCTIONS["bertattn"]
        assert bt.register() == "bertattn"
        assert ALL_ATTENTION_FUNCTIONS["bertattn"] is fn  # the same function, not a new one
        importlib.import_module("bertattn.integrations.transformers")  # cached: a no-op
        reloaded = importlib.reload(bt)  # runs the module again: registers again
        assert ALL_MASK_ATTENTION_FUNCTIONS["bertattn"] is reloaded.mask_forward
        assert ALL_ATTENTION_FUNCTIONS["bertattn"] is reloaded.attention_forward
        after = model(**batch).last_hidden_state
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_register_refuses_a_packed_backend_and_bad_names():
    with pytest.raises(ValueError, match="packed tokens"):
        bt.register("bertattn_varlen", backend="varlen")
    with pytest.raises(ValueError, match="unknown attention backend"):
        bt.register("bertattn_nope", backend="nope")
    with pytest.raises(ValueError, match="other than 'eager'"):
        bt.register("eager")


# ---------------------------------------------------------------------- the trap is closed
@pytest.mark.slow
def test_trap_exists_without_a_mask_function(minilm_dir, scratch_names):
    """Why the pair matters: transformers' own sdpa function registered alone under a new
    name gets attention_mask=None on a padded batch and silently attends to padding."""
    AttentionInterface.register("sdpa_without_mask", sdpa_attention_forward)
    scratch_names.append("sdpa_without_mask")
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="sdpa")
        trap = transformers.BertModel.from_pretrained(
            minilm_dir, attn_implementation="sdpa_without_mask"
        )
        err = (trap(**batch).last_hidden_state - ref(**batch).last_hidden_state).abs()
    assert err[real].max() > 0.1  # wrong, and nothing said so


def test_attention_function_alone_refuses_to_run(tiny_checkpoint, scratch_names):
    """bertattn's function registered without its mask function (the trap) refuses, by
    message, instead of attending to padding."""
    AttentionInterface.register("bertattn_without_mask", bt.attention_forward)
    scratch_names.append("bertattn_without_mask")
    model = transformers.BertModel.from_pretrained(
        tiny_checkpoint, attn_implementation="bertattn_without_mask"
    )
    with pytest.raises(ValueError, match="has no mask function") as info:
        model(**tiny_batch())
    assert "register('bertattn_without_mask')" in str(info.value)


def test_register_makes_the_name_safe(tiny_checkpoint, scratch_names):
    scratch_names.append(bt.register("bertattn_also"))
    batch = tiny_batch()
    with torch.no_grad():
        ours = transformers.BertModel.from_pretrained(
            tiny_checkpoint, attn_implementation="bertattn_also"
        )(**batch).last_hidden_state
        ref = transformers.BertModel.from_pretrained(tiny_checkpoint, attn_implementation="sdpa")(
            **batch
        ).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


def test_refuses_a_2d_padding_mask():
    q, k, v = qkv(b=2, lq=5, lk=5)
    padding = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])  # (B, Lk): polarity unknowable
    with pytest.raises(ValueError, match=r"2-D attention_mask of shape \(2, 5\).*mask function"):
        bt.attention_forward(layer(), q, k, v, padding)


def test_refuses_an_integer_4d_mask_and_other_objects():
    q, k, v = qkv(b=2, lq=5, lk=5)
    ints = padding_keep([3, 5], 5, 5).long()
    with pytest.raises(ValueError, match="integer mask is ambiguous"):
        bt.attention_forward(layer(), q, k, v, ints)
    with pytest.raises(ValueError, match="BlockMask"):
        bt.attention_forward(layer(), q, k, v, SimpleNamespace(shape=(2, 1, 5, 5)))
    with pytest.raises(ValueError, match="softcap"):
        bt.attention_forward(layer(), q, k, v, None, softcap=30.0)


def test_refuses_weights_from_a_fused_backend(scratch_names):
    scratch_names.append(bt.register("bertattn_sdpa", backend="sdpa"))
    q, k, v = qkv()
    fn = ALL_ATTENTION_FUNCTIONS["bertattn_sdpa"]
    with pytest.raises(ValueError, match="returns no attention weights"):
        fn(layer(), q, k, v, None, output_attentions=True)


# ---------------------------------------------------------------------- the function itself
@pytest.mark.parametrize("form", ["bool", "float", "none"])
def test_matches_sdpa_function(form):
    q, k, v = qkv(b=3, lq=6, lk=9)
    keep = padding_keep([9, 4, 7], 6, 9)
    mask = {
        "bool": keep,
        "float": torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min),
        "none": None,
    }[form]
    ours, w = bt.attention_forward(layer(), q, k, v, mask, scaling=8**-0.5)
    ref, _ = sdpa_attention_forward(layer(), q, k, v, mask, scaling=8**-0.5)
    assert w is None and ours.shape == (3, 6, 4, 8)  # (B, Lq, H, D), as transformers expects
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


def test_scaling_causal_and_grouped_query_like_sdpa():
    q, k, v = qkv(b=2, h=4, hkv=2, lq=5, lk=5)
    for kwargs in ({"scaling": 0.3}, {"scaling": None}):
        ours, _ = bt.attention_forward(layer(is_causal=True, groups=2), q, k, v, None, **kwargs)
        ref, _ = sdpa_attention_forward(layer(is_causal=True, groups=2), q, k, v, None, **kwargs)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    # is_causal passed by the caller wins over the module's flag, as in sdpa
    ours, _ = bt.attention_forward(layer(is_causal=True), *qkv(), None, is_causal=False)
    ref, _ = sdpa_attention_forward(layer(is_causal=True), *qkv(), None, is_causal=False)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


def test_weights_and_dropout_like_eager():
    """output_attentions=True runs math and returns eager's weights, dropout included (the
    same dropout on the same probabilities: equal under the same seed)."""
    q, k, v = qkv(b=2, lq=6, lk=6)
    keep = padding_keep([6, 3], 6, 6)
    bias = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    for training, p in ((False, 0.0), (True, 0.3)):
        torch.manual_seed(1)
        ours, w = bt.attention_forward(
            layer(training=training), q, k, v, keep, dropout=p, output_attentions=True
        )
        torch.manual_seed(1)
        ref, rw = eager_attention_forward(layer(training=training), q, k, v, bias, dropout=p)
        torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)


def test_auto_reads_the_policy_row_of_the_call():
    """The dispatch table's row for this device, dtype and key length decides, as in the
    module (a row that names math for short fp32 keys, and only for those)."""
    from bertattn.attention import policy

    q, k, v = qkv()  # key length 8: the "tiny" class
    rule = policy.Rule("cpu", "float32", "tiny", "math", 0.1, "test row")
    with policy.use_table((rule, *policy.TABLE)), bertattn.explain() as log:
        bt.attention_forward(layer(), q, k, v, None)
        bt.attention_forward(layer(), q.double(), k.double(), v.double(), None)
    assert log.backends() == ["math", "sdpa"]
    assert "policy: cpu float32 tiny" in log.records[0].reason


def test_in_place_edit_of_the_mask_is_seen():
    """The prepared mask is reused across layers, but not after the mask tensor changes."""
    q, k, v = qkv(b=2, lq=5, lk=5)
    keep = padding_keep([5, 5], 5, 5).clone()
    first, _ = bt.attention_forward(layer(), q, k, v, keep)
    keep[1, :, :, 2:] = False
    second, _ = bt.attention_forward(layer(), q, k, v, keep)
    ref, _ = sdpa_attention_forward(layer(), q, k, v, keep)
    torch.testing.assert_close(second, ref, rtol=0, atol=1e-6)
    assert not torch.allclose(first[1], second[1])


def test_dispatch_is_recorded_and_kept_on_the_layer():
    q, k, v = qkv()
    module = layer()
    with bertattn.explain() as log:
        bt.attention_forward(module, q, k, v, None)
        bt.attention_forward(module, q, k, v, None, output_attentions=True)
    assert log.backends() == ["sdpa", "math"]
    assert module.last_dispatch is log.records[-1]
    assert log.records[0].shape == (3, 4, 7, 8)
    assert "attention weights requested" in log.records[1].reason


def test_explicit_math_backend(tiny_checkpoint, scratch_names):
    scratch_names.append(bt.register("bertattn_math", backend="math"))
    model = transformers.BertModel.from_pretrained(
        tiny_checkpoint, attn_implementation="bertattn_math"
    )
    with torch.no_grad(), bertattn.explain() as log:
        model(**tiny_batch())
    assert log.backends() == ["math", "math"]
    assert all("asked for explicitly" in r.reason for r in log.records)


# ---------------------------------------------------------------------- tiny models
def test_tiny_decoder_causal_and_padded_like_sdpa(tiny_checkpoint):
    """A causal BERT (is_decoder=True): the mask function materializes the causal mask."""
    batch = tiny_batch(seed=3)
    out = {}
    for impl in ("bertattn", "sdpa", "eager"):
        model = transformers.BertModel.from_pretrained(
            tiny_checkpoint, is_decoder=True, attn_implementation=impl
        )
        with torch.no_grad():
            out[impl] = model(**batch, use_cache=False).last_hidden_state
    real = batch["attention_mask"].bool()
    for ref in ("sdpa", "eager"):
        torch.testing.assert_close(out["bertattn"][real], out[ref][real], rtol=0, atol=1e-5)


def test_tiny_gradients_like_sdpa(tiny_checkpoint):
    batch = tiny_batch(seed=4)
    grads = {}
    for impl in ("bertattn", "sdpa"):
        model = transformers.BertModel.from_pretrained(tiny_checkpoint, attn_implementation=impl)
        out = model(**batch).last_hidden_state
        (out * batch["attention_mask"][..., None]).square().sum().backward()
        grads[impl] = model.encoder.layer[0].attention.self.query.weight.grad
    torch.testing.assert_close(grads["bertattn"], grads["sdpa"], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------- the real checkpoint
@pytest.fixture(scope="module")
def real(minilm_dir):
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()  # a padded batch
    models = {
        impl: transformers.BertModel.from_pretrained(minilm_dir, attn_implementation=impl)
        for impl in ("bertattn", "sdpa", "eager")
    }
    return SimpleNamespace(batch=batch, real=batch["attention_mask"].bool(), models=models)


@pytest.mark.slow
def test_real_padded_batch_equals_sdpa_and_eager(real):
    with torch.no_grad():
        out = {impl: m(**real.batch).last_hidden_state for impl, m in real.models.items()}
    for ref in ("sdpa", "eager"):
        torch.testing.assert_close(
            out["bertattn"][real.real], out[ref][real.real], rtol=0, atol=1e-5
        )


@pytest.mark.slow
def test_real_attentions_equal_eager(real):
    with torch.no_grad(), bertattn.explain() as log:
        ours = real.models["bertattn"](**real.batch, output_attentions=True)
    with torch.no_grad():
        ref = real.models["eager"](**real.batch, output_attentions=True)
    assert log.backends() == ["math"] * 6
    assert len(ours.attentions) == len(ref.attentions) == 6
    length = real.real.shape[1]
    for a, r in zip(ours.attentions, ref.attentions, strict=True):
        assert a.shape == r.shape == (4, 12, length, length)
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        ours.last_hidden_state[real.real], ref.last_hidden_state[real.real], rtol=0, atol=1e-5
    )


@pytest.mark.slow
def test_real_dispatch_is_recorded(real):
    model = real.models["bertattn"]
    with torch.no_grad(), bertattn.explain() as log:
        model(**real.batch)
    assert log.backends() == ["sdpa"] * 6
    assert all("attn_implementation='bertattn'" in r.reason for r in log.records)
    b, length = real.real.shape
    assert log.records[0].shape == (b, 12, length, 32)
    assert model.encoder.layer[0].attention.self.last_dispatch == log.records[0]


# ---------------------------------------------------------------------- grad modes, autocast
def _real_err(a: torch.Tensor, b: torch.Tensor, real: torch.Tensor) -> float:
    return float((a.float() - b.float())[real].abs().max())


@pytest.mark.slow
def test_real_inference_mode_equals_sdpa(real):
    """Under torch.inference_mode the mask is an inference tensor (no version counter): it
    used to crash with "Inference tensors do not track version counter"."""
    with torch.inference_mode():
        ref = real.models["sdpa"](**real.batch).last_hidden_state
        first = real.models["bertattn"](**real.batch).last_hidden_state
        again = real.models["bertattn"](**real.batch).last_hidden_state  # the same mask again
    torch.testing.assert_close(first[real.real], ref[real.real], rtol=0, atol=1e-5)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    # and the model still trains afterwards: nothing prepared in inference mode is reused
    out = real.models["bertattn"](**real.batch).last_hidden_state
    out[real.real].sum().backward()
    grad = real.models["bertattn"].encoder.layer[0].attention.self.query.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    real.models["bertattn"].zero_grad(set_to_none=True)


@pytest.mark.slow
def test_real_no_grad_equals_sdpa(real):
    with torch.no_grad():
        ours = real.models["bertattn"](**real.batch).last_hidden_state
        ref = real.models["sdpa"](**real.batch).last_hidden_state
    assert not ours.requires_grad
    torch.testing.assert_close(ours[real.real], ref[real.real], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_real_bf16_autocast_like_sdpa(real):
    """Under CPU bf16 autocast, bertattn is as close to sdpa as sdpa is to eager (the same
    rule as the other low-precision tests: at most twice the baseline difference)."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = {impl: m(**real.batch).last_hidden_state for impl, m in real.models.items()}
    assert out["bertattn"].dtype == out["sdpa"].dtype
    baseline = _real_err(out["sdpa"], out["eager"], real.real)
    assert 0 < baseline < 0.5  # bf16 rounds; the baseline itself is sane
    assert _real_err(out["bertattn"], out["sdpa"], real.real) <= 2 * baseline


# ---------------------------------------------------------------------- torch.compile
def _tiny_random_model():
    """A 2-layer random BERT on "bertattn" (compile time stays short)."""
    sizes = {**TINY, "max_position_embeddings": 64}
    config = transformers.BertConfig(**sizes, attn_implementation="bertattn")
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


@pytest.mark.slow
def test_compile_has_no_graph_break():
    """It used to break the graph 7 times per forward of a 2-layer model (sdpa: 0), on
    torch.is_inference_mode_enabled in the mask cache's key."""
    model = _tiny_random_model()
    batch = tiny_batch()
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(**batch)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.slow
@pytest.mark.parametrize("weights", [False, True])
def test_compile_fullgraph_matches_eager(weights):
    model = _tiny_random_model()
    batch = tiny_batch()
    real = batch["attention_mask"].bool()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        want = model(**batch, output_attentions=weights)
        with bertattn.explain() as log:
            got = compiled(**batch, output_attentions=weights)
    assert log.records == []  # traced: no Python-side records inside the graph
    torch.testing.assert_close(
        got.last_hidden_state[real], want.last_hidden_state[real], rtol=0, atol=1e-5
    )
    if weights:
        for a, b in zip(got.attentions, want.attentions, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # eager calls after compiling still record their dispatch
    with torch.no_grad(), bertattn.explain() as log:
        model(**batch)
    assert len(log.records) == 2
