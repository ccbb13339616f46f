"""``Bert.load(compile=True)``: the encoder's forward through torch.compile (inductor, frozen
weights, dynamic shapes), exact against a float64 baseline as the eager path is, at head sizes
32 and 64, on padded batches, a batch of one and a fully masked row; and every way it cannot
run leaves the eager model with a warning that says why."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import bertattn
from bertattn.encoder import compiled as _compiled
from bertattn.families import registry

# torch's inductor import itself uses torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

TEXTS = [
    "hello",
    "the attention head looks at every token in the sentence",
    "ok",
    "bert model layer text line word " * 6,
]


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| relative to max |want|."""
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.fixture(scope="module", params=[32, 64], ids=["head32", "head64"])
def folder(request, tiny_checkpoint_factory):  # type: ignore[no-untyped-def]
    """A tiny BERT whose heads are 32 or 64 wide (2 heads)."""
    return tiny_checkpoint_factory(hidden_size=2 * request.param, num_attention_heads=2)


@pytest.fixture(scope="module")
def compiled_bert(folder):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    bert = bertattn.Bert.load(folder, compile=True)
    yield bert
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_encode_is_as_exact_as_eager(folder, compiled_bert):
    choice = compiled_bert.compile_choice
    assert choice is not None and choice.active, choice
    assert compiled_bert.compiled is not None
    eager = bertattn.Bert.load(folder)
    exact = bertattn.Bert.load(folder, dtype="float64")
    for texts in (TEXTS, TEXTS[:1], TEXTS[1:3]):  # padded, a batch of one, another length
        want = exact.encode(texts, convert_to_tensor=True, batch_size=8)
        got = compiled_bert.encode(texts, convert_to_tensor=True, batch_size=8)
        base = eager.encode(texts, convert_to_tensor=True, batch_size=8)
        # the baseline: eager float32's own error against float64, with a floor at float32's
        # rounding of these sizes
        bound = max(4 * _error(base, want), 1e-6)
        assert _error(got, want) <= bound, (texts, _error(got, want), bound)


@pytest.mark.slow
def test_compiled_graph_takes_a_fully_masked_row(compiled_bert):
    model = compiled_bert.model
    batch = compiled_bert.tokenizer.pad(compiled_bert.tokenizer.encode_batch(TEXTS[:3]))
    mask = batch.attention_mask.clone()
    mask[2] = 0  # a dead row: every key masked
    with torch.inference_mode():
        want = model(batch.input_ids, mask, batch.token_type_ids).last_hidden_state
        got = compiled_bert.compiled(batch.input_ids, mask, batch.token_type_ids)
    assert not got.isnan().any()
    real = mask.bool()
    assert _error(got[real], want[real].double()) <= 1e-5


@pytest.mark.slow
def test_explain_names_the_compiled_forward(compiled_bert):
    with bertattn.explain() as log:
        compiled_bert.encode(["hello world"])
    assert "encode: compile: compiled with torch.compile" in str(log)


def test_compile_must_be_a_bool(tiny_checkpoint):
    with pytest.raises(TypeError, match="compile"):
        bertattn.Bert.load(tiny_checkpoint, compile="yes")


def _loaded_eagerly(tiny_checkpoint, match: str) -> bertattn.Bert:  # type: ignore[no-untyped-def]
    with pytest.warns(UserWarning, match=match) as caught:
        bert = bertattn.Bert.load(tiny_checkpoint, compile=True)
    assert bert.compiled is None
    assert bert.compile_choice is not None and not bert.compile_choice.active
    assert "encoding eagerly" in str(caught[0].message).lower()
    eager = bertattn.Bert.load(tiny_checkpoint)
    assert torch.equal(
        bert.encode(TEXTS, convert_to_tensor=True), eager.encode(TEXTS, convert_to_tensor=True)
    )
    return bert


def test_no_cpp_compiler_is_named_and_the_model_stays_eager(tiny_checkpoint, monkeypatch):
    import torch._inductor.cpp_builder as builder

    def missing() -> str:
        raise RuntimeError("no C++ compiler found on PATH")

    monkeypatch.setattr(builder, "get_cpp_compiler", missing)
    _loaded_eagerly(tiny_checkpoint, "needs a C\\+\\+ compiler.*install g\\+\\+ or clang\\+\\+")


def test_a_failing_compile_names_its_real_cause(tiny_checkpoint, monkeypatch):
    def broken(self, ids, mask, types):  # type: ignore[no-untyped-def]
        raise RuntimeError("the graph broke on purpose")

    monkeypatch.setattr(_compiled.CompiledForward, "__call__", broken)
    _loaded_eagerly(tiny_checkpoint, "RuntimeError: the graph broke on purpose")


def test_a_graph_that_disagrees_with_eager_is_not_used(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(_compiled, "_check", lambda model, compiled, bert: 3e-2)
    _loaded_eagerly(tiny_checkpoint, "differs from the eager encoder by 3.00e-02")


def test_a_family_without_compile_is_refused_by_name(tiny_checkpoint, monkeypatch):
    bert = registry.get("bert")
    without = dataclasses.replace(
        bert, capabilities=bert.capabilities - {"compile"}, missing={"compile": "its test"}
    )
    real_get = registry.get
    monkeypatch.setattr(
        registry, "get", lambda name: without if name == "bert" else real_get(name)
    )
    _loaded_eagerly(tiny_checkpoint, f"{bert.title}: torch.compile of the encoder")


def test_cli_compile_with_onnx_is_a_usage_error(cli, tiny_checkpoint, tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("hello\n")
    out = tmp_path / "e.npy"
    r = cli("encode", src, "-o", out, "--model", tiny_checkpoint, "--onnx", tmp_path / "m.onnx",
            "--compile")  # fmt: skip
    assert r.code == 2, r
    assert "--compile compiles the PyTorch model" in r.err and "drop --compile" in r.err
    assert not out.exists()


@pytest.mark.slow
def test_cli_encode_compile_writes_the_eager_embeddings(cli, tiny_checkpoint_factory, tmp_path):
    """The model of ``folder``'s head32 (the same folder): the graph the module's tests
    compiled, which inductor's caches (its kernels' C++ builds) give back instead of a build
    of a third model's."""
    import numpy as np

    model = tiny_checkpoint_factory(hidden_size=2 * 32, num_attention_heads=2)
    src = tmp_path / "t.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    paths = {}
    for name, extra in (("eager", ()), ("compiled", ("--compile", "-v"))):
        paths[name] = tmp_path / f"{name}.npy"
        r = cli("encode", src, "-o", paths[name], "--model", model, *extra)
        assert r.code == 0, r
    assert "compiled with torch.compile" in r.err  # -v names the compiled forward
    got, want = np.load(paths["compiled"]), np.load(paths["eager"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
