"""The encoder contract (:mod:`bertattn.blocks.contract`): both stacks declare it, a stack that
keeps only the contract runs inside :class:`bertattn.BertModel` (its ``info`` obeyed), a
family whose build returns anything else is refused by the class's name, and the packing is
decided once per forward, however many layers run it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from tiny_bert import TINY, tiny_bertattn
from torch import Tensor, nn

from bertattn import BertConfig, BertModel, MultiHeadAttention
from bertattn.attention import PreparedMask
from bertattn.blocks import (
    EncoderBlock,
    EncoderStack,
    FeedForward,
    LayerKind,
    RotaryEncoder,
    contract,
)
from bertattn.blocks.contract import Packing, StackInfo
from bertattn.families import registry
from bertattn.families.bert_layers import BertEmbeddings, BertEncoder, BertLayer


class ToyStack(nn.Module):
    """Keeps the contract and nothing more: doubles the hidden states, no layers, no packed
    path (its ``info`` says so, and :meth:`forward_packed` would fail the test if called)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        self.calls = 0

    @property
    def info(self) -> StackInfo:
        return StackInfo(packed=False)

    def forward(self, hidden: Tensor, mask: PreparedMask, *rest: object) -> tuple[Tensor, tuple]:
        self.calls += 1
        return hidden * 2, ()

    def forward_packed(self, hidden: Tensor, packing: Packing, *rest: object) -> Tensor:
        raise AssertionError("the model packed for a stack whose info says packed=False")

    def position_bias(self, length: int, dtype: torch.dtype) -> Tensor | None:
        raise AssertionError("the model asked for a bias the stack's info does not declare")


def _family(monkeypatch, name: str, stack) -> BertConfig:  # type: ignore[no-untyped-def]
    """A family record building BERT's embeddings and ``stack(backend)``; a config of it."""
    bert = registry.get("bert")

    def build(config, backend, pooling):  # type: ignore[no-untyped-def]
        return BertEmbeddings(config), stack(backend), None

    monkeypatch.setattr(registry, "_REGISTRY", {**registry._REGISTRY})  # undone after
    registry.register(dataclasses.replace(bert, name=name, build=build))
    config = BertConfig(**TINY)
    config.family = name
    return config


def _rotary(backend: str = "auto", n: int = 1) -> RotaryEncoder:
    e, h = TINY["hidden_size"], TINY["num_attention_heads"]
    blocks = [
        EncoderBlock(
            MultiHeadAttention(e, h, backend=backend), FeedForward(e, 8, "gelu"),
            nn.LayerNorm(e), nn.LayerNorm(e), prenorm=False,
        )  # fmt: skip
        for _ in range(n)
    ]
    return RotaryEncoder(blocks, [LayerKind(10000.0)] * n, None)


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(5, TINY["vocab_size"], (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1:, 3:] = 0  # 47% padding: auto packs on the CPU for a stack that can
    return ids, mask


def test_both_stacks_declare_the_contract() -> None:
    bert = BertEncoder(BertConfig(**TINY))
    mpnet = BertEncoder(BertConfig(**TINY, relative_attention_num_buckets=32))
    rotary = _rotary()
    for stack in (bert, mpnet, rotary):
        assert isinstance(stack, EncoderStack)
    assert bert.info == StackInfo(packed=True, relative_bias=False, lean=True)
    assert mpnet.info == StackInfo(packed=True, relative_bias=True, lean=True)
    assert rotary.info == StackInfo(packed=True, relative_bias=False, lean=False)
    assert not isinstance(nn.Linear(2, 2), EncoderStack)


def test_a_stack_keeping_only_the_contract_runs_inside_bert_model(monkeypatch) -> None:
    model = BertModel(_family(monkeypatch, "toy_stack", lambda backend: ToyStack())).eval()
    ids, mask = _padded_batch()
    with torch.inference_mode():
        out = model(ids, mask)
        want = model.embeddings(ids, None) * 2
    assert model.encoder.calls == 1
    assert out.pooler_output is None
    torch.testing.assert_close(out.last_hidden_state, want, rtol=0, atol=0)


def test_an_explicit_packed_backend_is_refused_for_a_stack_without_a_packed_path(
    monkeypatch,
) -> None:
    config = _family(monkeypatch, "toy_stack", lambda backend: ToyStack())
    model = BertModel(config, backend="varlen").eval()
    with pytest.raises(ValueError, match=r"backend 'varlen' packs .* stack \(ToyStack\) has no "):
        model(torch.ones(1, 4, dtype=torch.long))


def test_a_family_building_no_stack_is_refused_by_name(monkeypatch) -> None:
    config = _family(monkeypatch, "not_a_stack", lambda backend: nn.Linear(2, 2))
    with pytest.raises(ValueError) as info:
        BertModel(config)
    assert str(info.value) == (
        "family 'not_a_stack' built a Linear as its encoder stack, which does not keep the "
        "encoder contract (it lacks layers, info, forward_packed, position_bias); build a stack "
        "that declares bertattn.blocks.contract.EncoderStack (layers, info, forward, "
        "forward_packed, position_bias)."
    )


@pytest.mark.parametrize("stack", ["bert", "rotary"])
@pytest.mark.parametrize("backend", ["varlen", "auto"])
def test_the_packing_is_decided_once_per_forward(monkeypatch, stack: str, backend: str) -> None:
    layers = 3
    if stack == "bert":
        model = BertModel(BertConfig(**{**TINY, "num_hidden_layers": layers}), backend=backend)
    else:
        config = _family(monkeypatch, "toy_rotary", lambda b: _rotary(b, layers))
        model = BertModel(config, backend=backend)
    asked: list[str] = []
    decide = contract.packs

    def counted(name: str) -> bool:
        asked.append(name)
        return decide(name)

    monkeypatch.setattr(contract, "packs", counted)
    seen: list[str] = []
    for layer in model.encoder.layers:  # what each layer's attention was handed
        real = layer.attn.attend_packed

        def spy(x, packed, *, real=real, **kw):  # type: ignore[no-untyped-def]
            seen.append(kw["backend"])
            return real(x, packed, **kw)

        layer.attn.attend_packed = spy
    ids, mask = _padded_batch()
    with torch.inference_mode():
        model.eval()(ids, mask)
    assert len(asked) == 1, asked  # one decision, not one per layer
    assert seen == ["varlen"] * layers  # every layer ran the backend decided


class Plain(BertLayer):
    """A subclass that declares nothing: it offers no fast path, whatever BertLayer offers."""


class Declared(BertLayer):
    """A subclass that declares the lean path itself (and says when it may run it)."""

    speed_paths = frozenset({contract.LEAN})

    def lean(self) -> bool:
        return not self.training


def _with_layers(model: BertModel, cls: type[BertLayer]) -> BertModel:
    """``model`` with each layer rebuilt as ``cls``, the same modules and weights."""
    for i, layer in enumerate(model.encoder.layers):
        other = cls.__new__(cls)
        nn.Module.__init__(other)
        for name, mod in layer._modules.items():
            other.add_module(name, mod)
        model.encoder.layers[i] = other.eval()
    return model


def test_fast_paths_are_keyed_on_what_a_layer_class_declares() -> None:
    from bertattn.encoder.int8 import Int8BertLayer

    assert BertLayer.speed_paths == {contract.LEAN, contract.INT8}
    assert Plain.speed_paths == Int8BertLayer.speed_paths == frozenset()
    assert not contract.offers(nn.Linear(2, 2), contract.LEAN)
    ids, mask = _padded_batch()
    stock = tiny_bertattn(backend="sdpa")
    with torch.inference_mode():
        want = stock(ids, mask).last_hidden_state
        assert not _with_layers(tiny_bertattn(backend="sdpa"), Plain).encoder.lean()
        declared = _with_layers(tiny_bertattn(backend="sdpa"), Declared)
        assert declared.encoder.lean()  # a subclass, running the lean path it declared
        torch.testing.assert_close(declared(ids, mask).last_hidden_state, want, rtol=0, atol=0)


def test_int8_refuses_a_layer_whose_class_does_not_offer_it(monkeypatch) -> None:
    from bertattn.encoder import int8

    monkeypatch.setattr(int8, "available", lambda: None)
    monkeypatch.setattr(int8, "check_speed", lambda: SimpleNamespace(form=None))  # not timed
    bert = SimpleNamespace(model=_with_layers(tiny_bertattn(), Plain))
    with pytest.raises(ValueError) as info:
        int8.quantize_model(bert, alpha=0.0)  # type: ignore[arg-type]
    assert str(info.value) == (
        "layer 0 is a Plain, which offers no int8 path (BertLayer declares 'int8' in its "
        "speed_paths; a family's EncoderBlock gets int8 products): build the family from "
        "bertattn.blocks to quantize it."
    )
