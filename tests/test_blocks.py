"""The shared blocks of bertattn.blocks and the family registry, each against a plain reference
written here (float64 formulas, not the code under test)."""

from __future__ import annotations

import pytest
import torch
from attention_helpers import noisy
from torch import nn

from bertattn import MultiHeadAttention
from bertattn.attention.padding import pack_padding_mask
from bertattn.blocks import (
    EncoderBlock,
    FeedForward,
    GatedFeedForward,
    LayerKind,
    RotaryTables,
    make_norm,
)
from bertattn.blocks.rotary import packed_positions
from bertattn.errors import ModelFolderError
from bertattn.families import registry


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_with_and_without_bias(bias: bool) -> None:
    norm = noisy(make_norm(10, 1e-5, bias=bias))
    x = torch.randn(4, 10)
    xd = x.double()
    mean, var = xd.mean(-1, keepdim=True), xd.var(-1, unbiased=False, keepdim=True)
    want = (xd - mean) / torch.sqrt(var + 1e-5) * norm.weight.double()
    if bias:
        want = want + norm.bias.double()
    else:
        assert norm.bias is None
    torch.testing.assert_close(norm(x).double(), want, atol=1e-5, rtol=0)


def test_rms_norm_and_bad_kinds() -> None:
    norm = noisy(make_norm(6, 1e-6, bias=False, kind="rms_norm"))
    x = torch.randn(3, 6).double()
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    torch.testing.assert_close(norm(x.float()).double(), want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        make_norm(6, 1e-6, bias=True, kind="rms_norm")
    with pytest.raises(ValueError, match="unknown norm kind 'batch'"):
        make_norm(6, 1e-6, kind="batch")


def test_feed_forwards_against_their_formulas() -> None:
    x = torch.randn(5, 8)
    plain = noisy(FeedForward(8, 11, "gelu"))
    h = x.double() @ plain.fc_in.weight.double().T + plain.fc_in.bias.double()
    h = 0.5 * h * (1 + torch.erf(h / 2**0.5))  # exact GELU
    want = h @ plain.fc_out.weight.double().T + plain.fc_out.bias.double()
    torch.testing.assert_close(plain(x).double(), want, atol=1e-5, rtol=0)
    gated = noisy(GatedFeedForward(8, 11, "silu", bias_out=True), 1)
    both = x.double() @ gated.w_in.weight.double().T  # (5, 22): the activated half first
    a, g = both[:, :11], both[:, 11:]
    want = (a * torch.sigmoid(a) * g) @ gated.w_out.weight.double().T + gated.w_out.bias.double()
    torch.testing.assert_close(gated(x).double(), want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="hidden_act='mish' is not supported"):
        FeedForward(8, 11, "mish")


@pytest.mark.parametrize("prenorm", [True, False])
def test_block_orders_its_norms(prenorm: bool) -> None:
    attn = noisy(MultiHeadAttention(8, 2, dropout=0.0))
    mlp = noisy(FeedForward(8, 5, "relu"), 2)
    n1, n2 = noisy(nn.LayerNorm(8), 3), noisy(nn.LayerNorm(8), 4)
    block = EncoderBlock(attn, mlp, n1, n2, prenorm=prenorm).eval()
    x = torch.randn(2, 7, 8)

    def attend(t: torch.Tensor) -> torch.Tensor:
        return attn(t, need_weights=False)[0]

    if prenorm:
        h = x + attend(n1(x))
        want = h + mlp(n2(h))
    else:
        h = n1(x + attend(x))
        want = n2(h + mlp(h))
    torch.testing.assert_close(block(x, attend), want, atol=1e-6, rtol=0)


def test_rotary_tables_per_kind_and_packed_positions() -> None:
    kinds = [LayerKind(10.0), LayerKind(1000.0, window=2), LayerKind(10.0)]
    tables = RotaryTables(4).padded(kinds, 5, torch.device("cpu"))
    assert set(tables) == {10.0, 1000.0}
    # position 3, pair 1 of base 10: angle 3 * 10 ** (-2/4)
    torch.testing.assert_close(tables[10.0].cos[3, 1], torch.tensor(3 * 10**-0.5).cos())
    keep = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    pos = packed_positions(pack_padding_mask(keep), torch.device("cpu"))
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert LayerKind(10.0, 3).describe() == "local (window 3), rotary theta 10"


def test_registry_names_refusals_and_capabilities() -> None:
    names = registry.names()
    for kind in ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet",
                 "modernbert", "gte", "nomic_bert", "jina_embeddings_v3"):  # fmt: skip
        assert kind in names
    with pytest.raises(ModelFolderError, match=r"cfg.json: model_type='t5' is not supported"):
        registry.lookup("t5", "cfg.json")
    assert registry.lookup(None).name == "bert"
    assert registry.get("bert").can("int8") and registry.get("gte").can("int8")
    assert not registry.get("gte").can("steps")
    registry.require("mpnet", "onnx", "ONNX export")  # MPNet exports: no refusal
    with pytest.raises(ValueError, match=r"steps view .* for MPNet's relative position bias"):
        registry.require("mpnet", "steps", "the steps view")
    with pytest.raises(ValueError, match=r"steps view .* for NomicBERT's rotary positions"):
        registry.require("nomic_bert", "steps", "the steps view")
    with pytest.raises(ValueError, match="unknown capability 'fp8'"):
        registry.get("bert").can("fp8")
