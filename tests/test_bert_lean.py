"""The encoder's lean path (``BertLayer.forward(..., lean=True)``): the same ops as the ordinary
path without the module calls between them. It must give bitwise the same result, and step aside
whenever a module call would do more than its forward (hooks, subclasses, training) or something
watches (steps recording, weights asked for, explain)."""

from __future__ import annotations

import pytest
import torch
from tiny_bert import TINY
from tiny_bert import tiny_bertattn as _model
from torch import nn

import bertattn
from bertattn import BertModel
from bertattn.attention import record_steps


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, TINY["vocab_size"], (4, 13), generator=g)
    mask = torch.ones(4, 13, dtype=torch.long)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    return ids, mask


def _ordinary(model: BertModel):  # type: ignore[no-untyped-def]
    """A hook that does nothing: the layer is no longer lean, so the ordinary path runs."""
    return model.encoder.layers[0].attn_norm.register_forward_hook(lambda *a: None)


@pytest.mark.parametrize(
    "backend, compute, padded",
    [
        ("auto", None, True),  # packs (varlen) on the CPU: the lean block after attend_packed
        ("sdpa", None, True),
        ("math", None, True),
        ("auto", None, False),
        ("sdpa", torch.bfloat16, True),  # mixed precision: casts into the GEMMs
    ],
)
def test_lean_equals_the_ordinary_path_bitwise(backend, compute, padded):
    model = _model(backend=backend)
    if compute is not None:
        model.to_compute_dtype(compute)
    ids, mask = _batch()
    if not padded:
        mask = None
    assert model.encoder.lean()
    with torch.inference_mode():
        lean = model(ids, mask, output_hidden_states=True)
        handle = _ordinary(model)
        assert not model.encoder.lean()
        ordinary = model(ids, mask, output_hidden_states=True)
        handle.remove()
    assert torch.equal(lean.last_hidden_state, ordinary.last_hidden_state)
    assert torch.equal(lean.pooler_output, ordinary.pooler_output)
    assert all(
        torch.equal(a, b) for a, b in zip(lean.hidden_states, ordinary.hidden_states, strict=True)
    )


def test_a_dead_row_is_zero_on_the_lean_path():
    model = _model(backend="sdpa")
    ids, mask = _batch()
    mask[3] = 0  # a row of padding only
    with torch.inference_mode():
        out = model(ids, mask).last_hidden_state
        handle = _ordinary(model)
        ref = model(ids, mask).last_hidden_state
        handle.remove()
    assert torch.equal(out, ref) and torch.isfinite(out).all()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, on importing dynamo
def test_hooks_subclasses_and_training_take_the_ordinary_path():
    model = _model(backend="sdpa")
    ids, mask = _batch()
    calls = []
    handle = model.encoder.layers[1].mlp.fc_out.register_forward_hook(lambda *a: calls.append(1))
    with torch.inference_mode():
        model(ids, mask)
    handle.remove()
    assert calls == [1]  # the hook ran: the module was called

    class Shifted(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 1.0

    with torch.inference_mode():
        before = model(ids, mask).last_hidden_state
        stock = model.encoder.layers[0].mlp.fc_in
        shifted = Shifted(stock.in_features, stock.out_features)
        shifted.load_state_dict(stock.state_dict())
        model.encoder.layers[0].mlp.fc_in = shifted.eval()
        assert not model.encoder.lean()
        after = model(ids, mask).last_hidden_state
    assert not torch.equal(before, after)  # the subclass's forward ran

    model.encoder.layers[0].mlp.fc_in = stock
    model.encoder.layers[1].attn_dropout.train()  # one module in training mode
    assert not model.encoder.lean()
    model.encoder.layers[1].attn_dropout.eval()
    assert model.encoder.lean()
    model.encoder.layers[1].attn.out_linear.compile()  # module.compile(): its call is compiled
    assert not model.encoder.lean()


def test_global_hooks_steps_and_weights_take_the_ordinary_path():
    model = _model(backend="auto")
    ids, mask = _batch()
    calls = []
    handle = nn.modules.module.register_module_forward_hook(lambda *a: calls.append(1))
    try:
        assert not model.encoder.lean()
        with torch.inference_mode():
            model(ids, mask)
    finally:
        handle.remove()
    assert len(calls) > 10  # every submodule was called
    with record_steps() as steps:
        assert not model.encoder.lean()
    with torch.inference_mode():
        out = model(ids, mask, output_attentions=[1])
    assert out.attentions[1] is not None and out.attentions[0] is None
    assert steps is not None


def test_explain_still_sees_every_layer():
    model = _model(backend="sdpa")
    ids, _ = _batch()
    with torch.inference_mode(), bertattn.explain() as log:
        model(ids)
    assert log.backends() == ["sdpa"] * TINY["num_hidden_layers"]
    assert model.encoder.layers[0].attn.last_dispatch.backend == "sdpa"


def test_gradients_through_the_lean_path_equal_the_ordinary_ones():
    """Eval mode with autograd on (saliency, adversarial inputs): the same graph either way."""
    model = _model(backend="sdpa")
    ids, mask = _batch()
    grads = []
    for ordinary in (False, True):
        handle = _ordinary(model) if ordinary else None
        assert model.encoder.lean() is not ordinary
        embeds = model.embeddings.word(ids).detach().requires_grad_(True)
        model.zero_grad()
        out = model(inputs_embeds=embeds, attention_mask=mask).pooler_output.sum()
        out.backward()
        grads.append((embeds.grad, model.encoder.layers[0].mlp.fc_in.weight.grad.clone()))
        if handle is not None:
            handle.remove()
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


# ---------------------------------------------------------------- embeddings, pooler, top level
def _ordinary_embeddings(model: BertModel):  # type: ignore[no-untyped-def]
    """A hook that does nothing on the embeddings' LayerNorm: they run module by module."""
    return model.embeddings.norm.register_forward_hook(lambda *a: None)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])  # auto packs this padded batch
@pytest.mark.parametrize("given", ["nothing", "token_type_ids", "position_ids", "inputs_embeds"])
def test_lean_embeddings_equal_the_lookups_bitwise(backend, given):
    """Positions 0..L-1 read as the first L rows and segment 0 as row 0 give the same sums as
    the lookups of the ordinary path, with or without the optional inputs."""
    model = _model(backend=backend)
    ids, mask = _batch()
    g = torch.Generator().manual_seed(1)
    kw: dict[str, object] = {"input_ids": ids, "attention_mask": mask}
    if given == "token_type_ids":
        kw["token_type_ids"] = torch.randint(0, TINY["type_vocab_size"], ids.shape, generator=g)
    elif given == "position_ids":
        kw["position_ids"] = torch.randint(0, ids.shape[1], ids.shape, generator=g)
    elif given == "inputs_embeds":
        kw["inputs_embeds"] = model.embeddings.word(kw.pop("input_ids")).detach()
    assert model.embeddings._lean()
    with torch.inference_mode():
        lean = model(**kw, output_hidden_states=True)
        handle = _ordinary_embeddings(model)
        assert not model.embeddings._lean()
        ordinary = model(**kw, output_hidden_states=True)
        handle.remove()
    assert torch.equal(lean.hidden_states[0], ordinary.hidden_states[0])
    assert torch.equal(lean.last_hidden_state, ordinary.last_hidden_state)
    if given == "nothing":  # no token types means segment 0 everywhere
        with torch.inference_mode():
            zeros = model(**kw, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        assert torch.equal(lean.last_hidden_state, zeros)


def test_embedding_options_and_hooks_take_the_lookups():
    model = _model(backend="sdpa")
    ids, mask = _batch()
    seen = []
    handle = model.embeddings.position.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    assert not model.embeddings._lean()
    with torch.inference_mode():
        model(ids, mask)
    handle.remove()
    assert len(seen) == 1 and seen[0].tolist() == list(range(ids.shape[1]))
    model.embeddings.word.max_norm = 0.5  # the lookup renormalizes rows: not a plain read
    assert not model.embeddings._lean()
    model.embeddings.word.max_norm = None
    model.embeddings.train()
    assert not model.embeddings._lean()


@pytest.mark.parametrize("part", ["embeddings", "encoder", "pooler"])
def test_hooks_on_the_top_level_modules_still_run(part):
    """The forward calls embeddings, encoder and pooler without the module call only when the
    call would add nothing: a hook on any of them runs, and can change the output."""
    model = _model(backend="sdpa")
    ids, mask = _batch()
    with torch.inference_mode():
        before = model(ids, mask)
        handle = getattr(model, part).register_forward_hook(
            lambda m, i, o: (o[0] * 2, o[1]) if isinstance(o, tuple) else o * 2
        )
        after = model(ids, mask)
        handle.remove()
    assert not torch.equal(before.pooler_output, after.pooler_output)
