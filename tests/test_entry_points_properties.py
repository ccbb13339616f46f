"""Property tests over the Python entry points' arguments: whatever a caller passes (ints of any
size, NumPy integers, floats, NaN, bools, strings, None, tensors, arrays, lists), a call either
works or raises ``TypeError`` / ``ValueError`` naming the argument, raised by bertattn's own
checks, never an error from inside torch, NumPy or the standard library."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import bertattn
from bertattn import Bert, BertModel, MultiHeadAttention
from bertattn.encoder.steps import attention_steps

SOURCE = Path(bertattn.__file__).parent

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: small tensors of the dtypes a caller may hand over
tensors = st.one_of(
    st.builds(torch.tensor, st.integers(-3, 200)),
    st.builds(torch.tensor, st.floats(-2, 2)),
    st.builds(torch.tensor, st.lists(st.integers(-3, 120), min_size=0, max_size=4)),
    hnp.arrays(
        st.sampled_from([np.int64, np.int32, np.int16, np.uint8, np.float32, np.float64, bool]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    ).map(lambda a: torch.from_numpy(np.ascontiguousarray(a))),
)

#: anything a caller might pass where a number, a flag or a name is expected
anything = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(-3, 300).map(np.int64),
    st.integers(-3, 120).map(np.int32),
    st.integers(0, 255).map(np.uint8),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 8).map(float),
    st.booleans(),
    st.booleans().map(np.bool_),
    st.text(max_size=8),
    st.integers(-3, 300).map(str),
    st.binary(max_size=4),
    st.none(),
    tensors,
    st.lists(st.integers(-3, 8), max_size=3),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def works_or_names(name: str, call: Callable[[], object]) -> None:
    """``call()`` works, or raises a TypeError / ValueError that names ``name``, raised in
    bertattn's own source (not in torch, NumPy or the standard library)."""
    try:
        call()
    except (TypeError, ValueError) as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        assert Path(frame.filename).is_relative_to(SOURCE), (
            f"{type(exc).__name__} raised outside bertattn, at {frame.filename}:{frame.lineno}: "
            f"{exc}"
        )
        assert name.lower() in str(exc).lower(), f"the message does not name {name!r}: {exc}"


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    before = torch.get_num_threads()  # load(threads=1) sets torch's count: not for later modules
    yield Bert.load(tiny_checkpoint, threads=1)
    torch.set_num_threads(before)


# ---------------------------------------------------------------------- attention_steps
@pytest.mark.parametrize("name", ["layer", "head", "query"])
@PROPERTY
@given(value=anything)
def test_attention_steps_arguments(bert, name, value):
    args = {"layer": 0, "head": 0, "query": 0, name: value}
    works_or_names(name, lambda: attention_steps(bert, "the model", **args))


@pytest.mark.parametrize("name", ["text", "pair", "max_length"])
@PROPERTY
@given(value=anything)
def test_attention_steps_text_arguments(bert, name, value):
    args = {"text": "the model", name: value}
    text = args.pop("text")
    works_or_names(name, lambda: bert.attention_steps(text, layer=1, head=1, query=1, **args))


@pytest.mark.parametrize("name", ["layers", "qkv_layers", "max_length"])
@PROPERTY
@given(value=st.one_of(anything, st.lists(anything, max_size=3)))
def test_attention_maps_arguments(bert, name, value):
    works_or_names(name, lambda: bert.attention_maps("the model", **{name: value}))


# ---------------------------------------------------------------------- Bert.encode
ENCODE_ARGS = [
    "inputs",
    "prompt_name",
    "prompt",
    "batch_size",
    "show_progress_bar",
    "output_value",
    "precision",
    "convert_to_numpy",
    "convert_to_tensor",
    "device",
    "normalize_embeddings",
    "truncate_dim",
    "chunk_size",
    "pooling",
    "normalize",
    "max_length",
    "progress",
    "batch_tokens",
]


@pytest.mark.parametrize("name", ENCODE_ARGS)
@PROPERTY
@given(value=st.one_of(anything, st.lists(anything, min_size=1, max_size=3)))
def test_encode_arguments(bert, name, value):
    args = {"inputs": ["the model", "a text"], name: value}
    works_or_names(name, lambda: bert.encode(**args))


@pytest.mark.parametrize("name", ["texts", "pooling", "normalize", "batch_size", "max_length"])
@PROPERTY
@given(value=anything)
def test_encode_with_stats_arguments(bert, name, value):
    args = {"texts": ["the model"], name: value}
    works_or_names(name, lambda: bert.encode_with_stats(**args))


# ---------------------------------------------------------------------- similarity
embeddings = st.one_of(
    anything,
    hnp.arrays(
        st.sampled_from([np.float32, np.float64, np.float16, np.int64, bool, np.complex64]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
    ),
    st.lists(st.lists(st.floats(-5, 5), min_size=1, max_size=4), min_size=1, max_size=3),
    st.lists(st.builds(torch.randn, st.integers(1, 4)), min_size=1, max_size=3),
)


@pytest.mark.parametrize("method", ["similarity", "similarity_pairwise"])
@PROPERTY
@given(a=embeddings, b=embeddings)
def test_similarity_arguments(bert, method, a, b):
    fn = getattr(bert, method)
    try:
        scores = fn(a, b)
    except (TypeError, ValueError) as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        assert Path(frame.filename).is_relative_to(SOURCE), f"{frame.filename}: {exc}"
        assert "embeddings1" in str(exc) or "embeddings2" in str(exc), str(exc)
    else:
        assert isinstance(scores, torch.Tensor) and scores.dim() in (0, 1, 2)


# ---------------------------------------------------------------------- BertModel
@pytest.mark.parametrize("name", ["input_ids", "attention_mask", "token_type_ids", "position_ids"])
@PROPERTY
@given(value=st.one_of(anything, tensors))
def test_forward_tensor_arguments(bert, name, value):
    model = bert.model
    args = {"input_ids": torch.tensor([[2, 30, 3], [2, 31, 3]]), name: value}
    works_or_names(name, lambda: model(**args))


@pytest.mark.parametrize(
    "name", ["output_attentions", "output_hidden_states", "return_dict", "inputs_embeds"]
)
@PROPERTY
@given(value=st.one_of(anything, st.lists(anything, max_size=3)))
def test_forward_other_arguments(bert, name, value):
    model = bert.model
    if name == "inputs_embeds":
        works_or_names(name, lambda: model(inputs_embeds=value))
        return
    works_or_names(name, lambda: model(torch.tensor([[2, 30, 3]]), **{name: value}))


@pytest.mark.parametrize(
    "name", ["dtype", "torch_dtype", "backend", "attn_implementation", "revision"]
)
@settings(PROPERTY, max_examples=30)
@given(value=st.one_of(anything, st.sampled_from([torch.int32, torch.float16, "bfloat16"])))
def test_from_pretrained_arguments(tiny_checkpoint, name, value):
    works_or_names(name, lambda: BertModel.from_pretrained(tiny_checkpoint, **{name: value}))


@pytest.mark.parametrize("name", ["dtype", "backend", "device", "threads"])
@settings(PROPERTY, max_examples=30)
@given(value=anything)
def test_load_arguments(tiny_checkpoint, name, value):
    if name == "threads" and bertattn.arguments.is_int(value) and value > 2:
        value = -value  # a valid large count would resize torch's thread pool: test its refusal
    works_or_names(name, lambda: Bert.load(tiny_checkpoint, **{name: value}))


@PROPERTY
@given(value=anything)
def test_load_path(value):
    if value is None or isinstance(value, str):
        return  # the default model, or a folder / hub name: ModelFolderError names the path
    works_or_names("path", lambda: Bert.load(value))


@PROPERTY
@given(value=anything)
def test_to_compute_dtype(value):
    from tiny_bert import tiny_bertattn

    works_or_names("dtype", lambda: tiny_bertattn().to_compute_dtype(value))


@pytest.mark.parametrize("name", ["max_seq_length", "similarity_fn_name"])
@PROPERTY
@given(value=anything)
def test_bert_settings(bert, name, value):
    fresh = Bert(bert.model, bert.tokenizer)  # a setter that works changes this one only
    works_or_names(name, lambda: setattr(fresh, name, value))


@PROPERTY
@given(value=anything)
def test_bert_to(bert, value):
    try:
        works_or_names("device", lambda: bert.to(value))
    finally:
        bert.to("cpu")


# ---------------------------------------------------------------------- MultiHeadAttention
@pytest.mark.parametrize("name", ["embed_dim", "num_heads", "dropout", "backend"])
@PROPERTY
@given(value=anything)
def test_multi_head_attention_constructor(name, value):
    args = {"embed_dim": 8, "num_heads": 2, name: value}
    if bertattn.arguments.is_int(args["embed_dim"]) and not 0 < args["embed_dim"] <= 64:
        args["embed_dim"] = -1  # refused for its range, before any memory is asked for
    works_or_names(name, lambda: MultiHeadAttention(**args))


@pytest.mark.parametrize("name", ["x", "mask", "key_value", "key_padding_mask", "need_weights"])
@PROPERTY
@given(value=st.one_of(anything, tensors))
def test_multi_head_attention_forward(name, value):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, dropout=0.0).eval()
    args = {"x": torch.randn(2, 3, 8), name: value}
    x = args.pop("x")
    works_or_names(name, lambda: m(x, **args))


# ---------------------------------------------------------------------- open_embeddings
@PROPERTY
@given(value=anything)
def test_open_embeddings_path(tmp_path, value):
    if isinstance(value, str) and value.strip():
        value = str(tmp_path / "missing" / value.replace("\0", ""))
    try:
        works_or_names("path", lambda: bertattn.open_embeddings(value))
    except FileNotFoundError:
        pass  # documented: a path that does not exist


def test_the_strategies_reach_the_hard_cases():
    """The generators hold the values the checks exist for (a guard against a strategy that
    stops producing them)."""
    seen = set()

    @settings(max_examples=400, deadline=None)
    @given(value=anything)
    def collect(value):
        if isinstance(value, np.integer):
            seen.add("numpy int")
        elif isinstance(value, (bool, np.bool_)):
            seen.add("bool")
        elif isinstance(value, float) and math.isnan(value):
            seen.add("nan")
        elif isinstance(value, float):
            seen.add("float")
        elif isinstance(value, str):
            seen.add("str")
        elif isinstance(value, torch.Tensor):
            seen.add("tensor")

    collect()
    assert seen >= {"numpy int", "bool", "float", "str", "tensor"}
