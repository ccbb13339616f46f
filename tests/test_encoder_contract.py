"""The encoder contract (:mod:`bertattn.blocks.contract`): both stacks declare it, a stack that
keeps only the contract runs inside :class:`bertattn.BertModel` (its ``info`` obeyed), a
family whose build returns anything else is refused by the class's name, and the packing is
decided once per forward, however many layers run it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_bert import TINY
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
from bertattn.families.bert_layers import BertEmbeddings, BertEncoder


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
