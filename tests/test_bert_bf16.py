"""bfloat16 end to end, against float32 by the relative rule.

The fast low-precision path (``auto``: packed varlen / fused sdpa) may be at most 2x as far from
the float32 reference as the plain low-precision path (the ``math`` backend in the same dtype).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertattn import Bert, BertModel

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "A very short one.",
    "BERT reads the whole sentence at once, so every token can attend to every other token, "
    "near or far, in each of its layers.",
    "",
    "Padding should never change the embedding of a sentence.",
]


@pytest.fixture(scope="module")
def batch(minilm_dir):
    bert = Bert.load(minilm_dir)
    tb = bert.tokenizer(SENTENCES)
    return tb.input_ids, tb.attention_mask


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bert_low_precision_relative_rule(minilm_dir, batch, dtype) -> None:
    ids, mask = batch
    real = mask.bool()
    with torch.inference_mode():
        ref = BertModel.from_pretrained(minilm_dir)(ids, mask).last_hidden_state[real]
        plain = BertModel.from_pretrained(minilm_dir, dtype=dtype, backend="math")
        fast = BertModel.from_pretrained(minilm_dir, dtype=dtype)  # auto
        low = plain(ids, mask).last_hidden_state[real].float()
        out = fast(ids, mask).last_hidden_state[real].float()
    assert fast.dtype == dtype and torch.isfinite(out).all()
    err_low = (low - ref).abs().max().item()
    err_fast = (out - ref).abs().max().item()
    assert err_low > 0  # the low-precision path really ran in low precision
    assert err_fast <= 2 * err_low, (err_fast, err_low)


def test_bf16_encode_min_cosine_vs_fp32(minilm_dir) -> None:
    """The issue's bf16 target: min cosine >= 0.9999 against float32 (real checkpoint)."""
    fp32 = Bert.load(minilm_dir).encode(SENTENCES)
    bf16 = Bert.load(minilm_dir, dtype="bfloat16").encode(SENTENCES)
    assert bf16.dtype == np.float32
    cos = (fp32 * bf16).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(bf16, axis=1))
    assert cos.min() >= 0.9999, cos


def test_mixed_precision_widens_in_the_residual_add(tiny_checkpoint, monkeypatch) -> None:
    """to_compute_dtype: the bf16 block outputs are widened inside the residual add (one op,
    not a cast and an add): two dtype casts per layer remain, the LayerNorm outputs going into
    the bf16 matrix products; the result is bitwise what the explicit casts gave."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bertattn.families import bert_layers as model_module

    class Casts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype):
                self.n += 1
            return func(*args, **(kwargs or {}))

    model = BertModel.from_pretrained(tiny_checkpoint, backend="sdpa").to_compute_dtype(
        torch.bfloat16
    )
    ids = torch.randint(5, 99, (2, 11))
    with torch.inference_mode():
        with Casts() as casts:
            out = model(ids).last_hidden_state
        layers = model.config.num_hidden_layers
        # per layer: the attention input and the MLP input to bf16; then the pooler's in and out
        assert casts.n == 2 * layers + 2
        monkeypatch.setattr(model_module, "residual_add", lambda x, a: x + a.to(x.dtype))
        explicit = model(ids).last_hidden_state
    assert out.dtype == torch.float32
    assert torch.equal(out, explicit)
