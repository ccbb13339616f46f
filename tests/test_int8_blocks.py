"""int8 for the families built from bertattn's blocks (bertattn.encoder.int8_blocks): random
ModernBERT, GTE and Qwen3 folders (tiny, seeded noise on every parameter, saved by transformers)
quantized in the one form that is exact on every CPU (u8 x s7: no int16 saturation), against the
same model's float32 path. The product timing is left out (it decides the form, tested in
test_int8_speed.py), so these run wherever oneDNN's int8 product exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_bert import save_random

from bertattn import Bert
from bertattn.encoder import int8, int8_blocks
from bertattn.encoder.int8_blocks import (
    LinearProduct,
    Product,
    QkvProduct,
    install,
    products,
    run_fused,
    why_not_fused,
)
from bertattn.encoder.int8_forms import U8_S7_F32
from bertattn.encoder.int8_speed import Speed

pytestmark = [
    pytest.mark.slow,  # the first int8 call compiles the quantize kernels
    pytest.mark.skipif(int8.available() is not None, reason=str(int8.available())),
]

SIZES = dict(vocab_size=99, hidden_size=36, num_hidden_layers=3, intermediate_size=29,
             max_position_embeddings=300, pad_token_id=0)  # fmt: skip
#: (model class, config class, settings): a gated pre-norm stack with a local window, a
#: post-norm rotary stack, and grouped causal heads with q/k norms
FAMILIES = {
    "modernbert": ("ModernBertModel", "ModernBertConfig", dict(
        num_attention_heads=3, local_attention=6, global_attn_every_n_layers=2,
        cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)),
    "gte": ("GteModel", "GteConfig", dict(num_attention_heads=3, type_vocab_size=2)),
    "qwen3": ("Qwen3Model", "Qwen3Config", dict(
        num_attention_heads=6, num_key_value_heads=2, head_dim=10, rms_norm_eps=1e-6)),
}  # fmt: skip
#: what the product timing would have kept (a made-up measurement: the timing is tested elsewhere)
TIMED = Speed(256, 384, 1536, int8_s=0.5e-3, float32_s=1e-3, cpu="test", threads=1, form=U8_S7_F32)
TEXTS = [
    "the attention head looks at every token in the sentence and weighs it",
    "hello",
    "a model and a layer, ok",
    "first second " * 12,
]


@pytest.fixture(autouse=True)
def _exact_form(monkeypatch) -> None:
    monkeypatch.setattr(int8, "check_speed", lambda: TIMED)


def _family_folder(name: str, tmp_path_factory, tiny_checkpoint: Path) -> Path:
    """A random folder of the tiny family ``name`` (:data:`FAMILIES`), with the tiny tokenizer."""
    import transformers

    model_name, config_name, extra = FAMILIES[name]
    config = getattr(transformers, config_name)(**{**SIZES, **extra})
    out = tmp_path_factory.mktemp(name)
    save_random(getattr(transformers, model_name), config, out, 5, tiny_checkpoint)
    return out


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def folder(request, tmp_path_factory, tiny_checkpoint) -> Path:
    return _family_folder(request.param, tmp_path_factory, tiny_checkpoint)


def _load(folder: Path, backend: str = "auto") -> Bert:
    return Bert.load(folder, dtype="float32", backend=backend, threads=1)


def _rows(bert: Bert) -> torch.Tensor:
    return bert.encode(TEXTS, convert_to_tensor=True, normalize_embeddings=True, pooling="mean")


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_every_product_runs_in_int8_close_to_float32(
    folder: Path, backend: str, monkeypatch
) -> None:
    bert = _load(folder, backend)
    want = _rows(bert)
    int8.quantize_model(bert, texts=TEXTS)
    found = products(bert.model)
    layers = len(bert.model.encoder.layers)
    # q/k/v and the attention output, and the feed-forward's two linears, in every layer
    assert sum(isinstance(p, QkvProduct) for p in found) == layers
    assert sum(isinstance(p, LinearProduct) for p in found) == 3 * layers
    # every block runs its feed-forward half fused, calling its products' int8 matmul itself
    assert all(la.fast_path is run_fused for la in bert.model.encoder.layers)
    ran: set[int] = set()
    real_matmul, real_fused = int8.Int8Linear.matmul, int8_blocks.run_fused
    fused: list[int] = []
    monkeypatch.setattr(int8.Int8Linear, "matmul", lambda m, q: ran.add(id(m)) or real_matmul(m, q))
    monkeypatch.setattr(int8_blocks, "run_fused", lambda *a: fused.append(1) or real_fused(*a))
    for la in bert.model.encoder.layers:
        la.fast_path = int8_blocks.run_fused
    got = _rows(bert)
    assert ran == {id(p.int8) for p in found}  # padded (sdpa) and packed (varlen) alike
    assert len(fused) >= layers
    assert bert.precision == "int8"
    fidelity = int8.compare(want, got)
    assert fidelity.min_cosine >= int8.MIN_COSINE, fidelity
    assert not torch.equal(got, want)  # the int8 products ran, rounding and all


def test_the_fused_feed_forward_half_is_the_products_one_by_one(folder: Path) -> None:
    """The fused steps compute what the block's products compute one by one (same codes, same
    products): the two int8 models are apart by a small share of int8's own distance from
    float32 (a value on a rounding edge may take the other code)."""
    bert = _load(folder)
    want = _rows(bert)
    int8.quantize_model(bert, texts=TEXTS)
    got = _rows(bert)
    layers = bert.model.encoder.layers
    for la in layers:
        la.fast_path = None  # each product on its own, as before the fusion
    apart = (got - _rows(bert)).norm(dim=1)
    own = (got - want).norm(dim=1)
    assert float(own.min()) > 0.0
    assert float(apart.max()) <= 0.05 * float(own.min()), (apart, own)


def test_the_fused_half_steps_aside_where_it_would_skip_a_call(folder: Path) -> None:
    """A hook on a module the fused steps stand in for, or int8 switched off: the block runs
    as written (the hook fires; float32 is float32)."""
    bert = _load(folder)
    want = _rows(bert)
    int8.quantize_model(bert, texts=TEXTS)
    block = bert.model.encoder.layers[-1]
    seen: list[int] = []
    handle = block.mlp.register_forward_hook(lambda m, a, o: seen.append(1))
    _rows(bert)
    handle.remove()
    assert seen  # the feed-forward module was called
    with int8.float32_path(bert.model):
        assert torch.equal(_rows(bert), want)


def test_a_block_the_steps_do_not_cover_says_why() -> None:
    from bertattn import MultiHeadAttention
    from bertattn.blocks import EncoderBlock, FeedForward, SandwichBlock

    def parts() -> tuple[MultiHeadAttention, FeedForward, torch.nn.Module]:
        return MultiHeadAttention(8, 2), FeedForward(8, 16, "gelu"), torch.nn.LayerNorm(8)

    attn, mlp, norm = parts()
    sandwich = SandwichBlock(attn, mlp, (norm, norm, norm, norm))
    assert why_not_fused(sandwich) == "a SandwichBlock, not an EncoderBlock"
    attn, mlp, norm = parts()
    plain = EncoderBlock(attn, mlp, norm, torch.nn.LayerNorm(8), prenorm=False)
    assert why_not_fused(plain) == "feed-forward linears that are not int8 products"
    install(plain)
    assert why_not_fused(plain) is None
    attn, mlp, norm = parts()
    odd = EncoderBlock(attn, mlp, torch.nn.Identity(), norm, prenorm=False)
    install(odd)
    assert why_not_fused(odd) == "a Identity norm"


def test_float32_path_is_the_float32_model_and_the_checkpoint_stays(folder: Path) -> None:
    bert = _load(folder)
    before = {k: v.clone() for k, v in bert.model.state_dict().items()}
    want = _rows(bert)
    int8.quantize_model(bert, texts=TEXTS)
    after = bert.model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    with int8.float32_path(bert.model):
        assert torch.equal(_rows(bert), want)
    with pytest.raises(ValueError, match="this model is int8 already"):
        int8.quantize_model(bert)


def test_smoothing_moves_the_activation_range_into_the_weights(folder: Path) -> None:
    bert = _load(folder)
    int8.quantize_model(bert, texts=TEXTS, alpha=0.6)
    smoothed = [p.int8.inv_smooth for p in products(bert.model)]
    assert all(not torch.equal(s, torch.ones_like(s)) for s in smoothed)
    plain = _load(folder)
    int8.quantize_model(plain, texts=TEXTS, alpha=0.0)
    assert all(torch.equal(p.int8.inv_smooth, torch.ones_like(p.int8.inv_smooth))
               for p in products(plain.model))  # fmt: skip


def test_a_product_runs_float32_where_int8_does_not() -> None:
    lin = torch.nn.Linear(8, 5)
    prod = LinearProduct(lin.eval()).eval()
    prod.quantize(lambda w, b, s: int8.Int8Linear(w, b, s, form=U8_S7_F32), alpha=0.0)
    x = torch.randn(4, 8)
    want = lin(x)
    assert not torch.equal(prod(x), want)  # int8
    prod.int8_enabled = False
    assert torch.equal(prod(x), want)
    prod.int8_enabled = True
    assert torch.equal(prod.train()(x), want)  # training: the float32 product
    assert isinstance(prod, Product) and prod.weight is lin.weight


def test_load_int8_for_a_block_family_verifies_and_explains(folder: Path) -> None:
    bert = Bert.load(folder, dtype="int8", threads=1)
    assert bert.precision == "int8" and products(bert.model)
    assert bert.dtype_reason == (
        f"int8 products as {TIMED}; float32 around them (auto: {bert.model.config.family}'s "
        f"EncoderBlock layers keep float32 around their int8 products)"
    )
    assert bert.dtype_reason.startswith("int8 products as u8 x s7 -> float32: ")


def test_an_int8_block_model_survives_deepcopy_and_pickle(folder: Path) -> None:
    """A copy's q/k/v product points at the copy's own attention (not the original's), its
    blocks keep their fused feed-forward half, and the copy computes what the original does."""
    import copy
    import io

    bert = _load(folder)
    int8.quantize_model(bert, texts=TEXTS)
    ids = torch.randint(5, 99, (2, 7))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        want = bert.model(ids, mask).last_hidden_state
    buf = io.BytesIO()
    torch.save(bert.model, buf)
    buf.seek(0)
    for other in (copy.deepcopy(bert.model), torch.load(buf, weights_only=False)):
        owned = {id(m) for m in other.modules()}
        assert all(id(p._attn) in owned for p in products(other) if isinstance(p, QkvProduct))
        assert all(la.fast_path is run_fused for la in other.encoder.layers)  # still fused
        with torch.inference_mode():
            assert torch.equal(other(ids, mask).last_hidden_state, want)


@pytest.mark.parametrize("family", ["bert", "gte"])
def test_load_int8_on_a_packed_backend_is_the_padded_int8_model(
    family: str, tmp_path_factory, tiny_checkpoint, monkeypatch
) -> None:
    """``backend="varlen"`` runs each layer's ``forward_packed``, never the layer's own call:
    SmoothQuant's calibration still sees every product's input, and the int8 model loads,
    passes the bar against float32 and is the padded int8 model to within a small share of
    int8's own distance from float32 (BERT's int8 layer, and a block family's products)."""
    if family == "bert":
        folder = tiny_checkpoint
    else:
        folder = _family_folder(family, tmp_path_factory, tiny_checkpoint)
    want = _rows(_load(folder))
    padded = Bert.load(folder, dtype="int8", backend="sdpa", threads=1)
    packed = Bert.load(folder, dtype="int8", backend="varlen", threads=1)
    got_padded = _rows(padded)
    ran: list[int8.Int8Linear] = []
    real = int8.Int8Linear.matmul
    monkeypatch.setattr(int8.Int8Linear, "matmul", lambda lin, q: ran.append(lin) or real(lin, q))
    got = _rows(packed)
    layers = packed.model.encoder.layers
    assert ran and {la.attn.last_dispatch.backend for la in layers} == {"varlen"}  # packed, in int8
    fidelity = int8.compare(want, got)
    assert fidelity.min_cosine >= int8.MIN_COSINE, fidelity
    own = (got_padded - want).norm(dim=1)  # int8's own distance from float32, per text
    apart = (got - got_padded).norm(dim=1)
    assert float(own.min()) > 0.0  # the padded model ran in int8 too
    # the two run different attention kernels, so an activation may round the other way now
    # and then; a calibration that missed a product's input puts them further apart than int8
    # is from float32 (the BERT model smoothed without its q/k/v range: 1.2 times; here 2e-5)
    assert float(apart.max()) <= 0.25 * float(own.min()), (apart, own)


def test_bert_layers_get_their_own_modules_back_after_calibration(tiny_checkpoint) -> None:
    bert = _load(tiny_checkpoint, "varlen")
    int8.quantize_model(bert, texts=TEXTS)
    for layer in bert.model.encoder.layers:
        assert isinstance(layer, int8.Int8BertLayer)
        assert "qkv_product" not in layer.attn._modules
        assert type(layer.attn.out_linear) is torch.nn.Linear
        assert type(layer.mlp.fc_in) is torch.nn.Linear
        assert type(layer.mlp.fc_out) is torch.nn.Linear
    assert not products(bert.model)


def test_smoothing_without_calibration_texts_is_refused(tiny_checkpoint) -> None:
    bert = _load(tiny_checkpoint, "varlen")
    with pytest.raises(ValueError, match=r"calibration saw no input of layer 0's qkv product "
                       r"\(0 texts\); expected .* or alpha=0 for no smoothing"):  # fmt: skip
        int8.quantize_model(bert, texts=[])
    assert type(bert.model.encoder.layers[0].attn.out_linear) is torch.nn.Linear
