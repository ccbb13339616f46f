"""The Python entry points check their arguments where a call comes in, as the jobs layer checks
its options: a wrong type is a ``TypeError``, a value out of range a ``ValueError``, and the
message names the argument, the value and what is valid. NumPy integer scalars pass wherever an
int does; a bool, a float or a digit string does not.

Each test here is a case that went wrong before the checks (an error from inside torch, an
"out of range" for a valid value, a value looked up as something it is not); the property tests
over every argument are in ``test_entry_points_properties.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertattn import Bert, BertModel
from bertattn.arguments import ArgumentTypeError
from bertattn.encoder.steps import attention_steps


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    before = torch.get_num_threads()  # load(threads=1) sets torch's count: not for later modules
    yield Bert.load(tiny_checkpoint, threads=1)
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(bert):
    return bert.model


# ---------------------------------------------------------------------- Bert.similarity
def test_similarity_refuses_mismatched_widths_naming_both_shapes(bert):
    a, b = np.ones((2, 4), dtype=np.float32), np.ones((3, 5), dtype=np.float32)
    with pytest.raises(ValueError, match=r"embeddings1 .*\(2, 4\).*embeddings2 .*\(3, 5\)"):
        bert.similarity(a, b)
    with pytest.raises(ValueError, match=r"embeddings1 .*\(2, 4\).*embeddings2 .*\(3, 5\)"):
        bert.similarity_pairwise(a, b)


def test_similarity_refuses_three_dimensional_input(bert):
    with pytest.raises(ValueError, match=r"embeddings2 has shape \(1, 2, 4\)"):
        bert.similarity(np.ones((2, 4)), np.ones((1, 2, 4)))


@pytest.mark.parametrize("bad", ["some text", ["a", "b"], None, {"x": 1}, [[1.0], [2.0, 3.0]]])
def test_similarity_refuses_what_is_not_numbers(bert, bad):
    with pytest.raises((TypeError, ValueError), match="embeddings1") as err:
        bert.similarity(bad, np.ones((1, 4)))
    assert err.type in (ArgumentTypeError, ValueError)


def test_similarity_of_float64_with_float32_rows(bert):
    a = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float32)
    assert bert.similarity(a, b).tolist() == [[1.0, 0.0]]


# ---------------------------------------------------------------------- from_pretrained dtype
@pytest.mark.parametrize("dtype", [torch.int32, "int64", torch.bool, torch.complex64])
def test_from_pretrained_refuses_a_dtype_that_is_not_floating_point(tiny_checkpoint, dtype):
    with pytest.raises(ValueError, match=r"dtype.* use one of float32, float16, bfloat16"):
        BertModel.from_pretrained(tiny_checkpoint, dtype=dtype)


@pytest.mark.parametrize("dtype", [32, 1.5, np.float32])
def test_from_pretrained_dtype_of_another_type_is_a_type_error(tiny_checkpoint, dtype):
    with pytest.raises(TypeError, match="dtype must be one of float32"):
        BertModel.from_pretrained(tiny_checkpoint, dtype=dtype)


def test_from_pretrained_takes_every_dtype_spelling_it_documents(tiny_checkpoint):
    for dtype in ("float16", "torch.bfloat16", torch.float32, "half", "auto", None):
        BertModel.from_pretrained(tiny_checkpoint, dtype=dtype)
    with pytest.raises(ValueError, match="torch_dtype"):
        BertModel.from_pretrained(tiny_checkpoint, torch_dtype=torch.int8)


# ---------------------------------------------------------------------- attention_steps
def test_attention_steps_takes_numpy_integers(bert):
    plain = attention_steps(bert, "the model", layer=1, head=3, query=1)
    steps = attention_steps(
        bert, "the model", layer=np.int64(1), head=np.int32(3), query=np.int64(1)
    )
    assert (steps.layer, steps.head, steps.query) == (1, 3, 1)
    assert type(steps.layer) is int and type(steps.head) is int
    assert torch.equal(steps.weights, plain.weights)


@pytest.mark.parametrize("name", ["layer", "head"])
@pytest.mark.parametrize("bad", ["1", 1.0, True, torch.tensor(1), None])
def test_attention_steps_layer_and_head_of_another_type_are_type_errors(bert, name, bad):
    args = {"layer": 0, "head": 0, "query": 0, name: bad}
    with pytest.raises(TypeError, match=rf"^{name} must be an int in 0\.\.") as err:
        attention_steps(bert, "the model", **args)
    assert "out of range" not in str(err.value)


def test_attention_steps_out_of_range_still_says_the_range(bert):
    with pytest.raises(ValueError, match=r"layer 2 is out of range: this model has layers 0..1"):
        attention_steps(bert, "the model", layer=2, head=0, query=0)
    with pytest.raises(ValueError, match=r"head -1 is out of range: this model has heads 0..3"):
        bert.attention_steps("the model", layer=0, head=-1, query=0)


@pytest.mark.parametrize("bad", [1.5, True, torch.tensor(1), None, b"model", ["model"]])
def test_attention_steps_query_of_another_type_is_a_type_error(bert, bad):
    with pytest.raises(TypeError, match=r"query must be a token index \(int\) or a token's text"):
        attention_steps(bert, "the model", layer=0, head=0, query=bad)


@pytest.mark.parametrize("query", ["²", "--1"])
def test_attention_steps_query_that_only_looks_like_a_number_is_token_text(bert, query):
    with pytest.raises(ValueError, match=rf"^query '{query}': token '{query}' is not in the"):
        attention_steps(bert, "the model", layer=0, head=0, query=query)


def test_attention_steps_query_by_text_and_digits_still_work(bert):
    steps = attention_steps(bert, "the model", layer=0, head=0, query="model")
    assert steps.tokens[steps.query] == "model"
    assert attention_steps(bert, "the model", layer=0, head=0, query="-1").query == 3


# ---------------------------------------------------------------------- BertModel.forward
def _ids(*rows: list[int]) -> torch.Tensor:
    return torch.tensor(rows)


@pytest.mark.parametrize("bad", [99, 1000, -1])
def test_forward_refuses_token_ids_outside_the_vocabulary(model, bad):
    with pytest.raises(ValueError, match=rf"input_ids holds {bad}.* 0\.\.98 .*vocab_size=99"):
        model(_ids([2, 5, 3], [2, bad, 3]))


def test_forward_refuses_token_type_ids_outside_the_types(model):
    ids = _ids([2, 5, 3])
    with pytest.raises(ValueError, match=r"token_type_ids holds 2.* 0\.\.1 .*type_vocab_size=2"):
        model(ids, token_type_ids=_ids([0, 1, 2]))
    with pytest.raises(ValueError, match=r"token_type_ids holds -1"):
        model(ids, token_type_ids=_ids([0, -1, 0]))


def test_forward_refuses_position_ids_outside_the_table(model):
    with pytest.raises(ValueError, match=r"position_ids holds 128.* 0\.\.127"):
        model(_ids([2, 5, 3]), position_ids=_ids([0, 1, 128]))


@pytest.mark.parametrize("shape", [(2, 0), (0, 0)])
def test_forward_refuses_sequences_of_no_token(model, shape):
    with pytest.raises(ValueError, match=rf"input_ids has shape \({shape[0]}, {shape[1]}\)"):
        model(torch.zeros(shape, dtype=torch.long))


def test_forward_of_a_batch_of_no_sequence_still_runs(model):
    assert model(torch.zeros((0, 3), dtype=torch.long)).last_hidden_state.shape == (0, 3, 32)


def test_forward_refuses_ids_that_are_not_integers(model):
    with pytest.raises(
        TypeError, match=r"input_ids must hold integer token ids \(int64 or int32\), got float32"
    ):
        model(torch.ones(1, 3))
    with pytest.raises(TypeError, match="token_type_ids must be a torch.Tensor"):
        model(_ids([2, 5, 3]), token_type_ids=[[0, 0, 0]])
    with pytest.raises(TypeError, match="attention_mask must be a torch.Tensor"):
        model(_ids([2, 5, 3]), attention_mask=[[1, 1, 1]])


def test_forward_output_attentions_takes_numpy_layer_indices(model):
    out = model(_ids([2, 5, 3]), output_attentions=[np.int64(1)])
    assert out.attentions[0] is None and out.attentions[1].shape == (1, 4, 3, 3)
    with pytest.raises(TypeError, match="output_attentions"):
        model(_ids([2, 5, 3]), output_attentions=["1"])


# ---------------------------------------------------------------------- Bert.encode, load
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size=0 is out of range"),
        ({"batch_size": -1}, ValueError, r"batch_size=-1 is out of range"),
        ({"batch_size": 1.5}, TypeError, r"batch_size must be an int >= 1, got 1\.5"),
        ({"batch_size": True}, TypeError, r"batch_size must be an int >= 1, got True"),
        ({"batch_size": "8"}, TypeError, r"batch_size must be an int >= 1, got '8'"),
        ({"inputs": 5}, TypeError, r"inputs must be a str or an iterable of str, got int"),
        ({"inputs": ["a", None]}, TypeError, r"inputs\[1\] is a NoneType, not a str"),
        ({"inputs": ["a", 3]}, TypeError, r"inputs\[1\] is a int, not a str"),
        ({"normalize": "yes"}, TypeError, r"normalize must be True, False or None, got 'yes'"),
        ({"normalize_embeddings": 1}, TypeError, r"normalize_embeddings must be True or False"),
        ({"convert_to_tensor": "no"}, TypeError, r"convert_to_tensor must be True or False"),
        ({"max_length": 1}, ValueError, r"max_length=1 is out of range: .* 3\.\.128"),
        ({"max_length": "64"}, TypeError, r"max_length must be an int in 3\.\.128 or None"),
        ({"pooling": 1}, TypeError,
         r"pooling must be one of 'mean', 'cls', 'max', 'lasttoken' or None"),
        ({"truncate_dim": 2.0}, TypeError, r"truncate_dim must be an int >= 1 or None"),
        ({"batch_tokens": 0}, ValueError, r"batch_tokens=0 is out of range"),
        ({"prompt_name": ["query"]}, TypeError, r"prompt_name must be a str or None"),
        ({"progress": 3}, TypeError, r"progress must be a callable .* or None, got 3"),
    ],
)
def test_encode_names_the_argument(bert, kwargs, error, message):
    kwargs = {"inputs": ["a text", "another"], **kwargs}
    with pytest.raises(error, match=message):
        bert.encode(**kwargs)


def test_encode_takes_numpy_integers(bert):
    want = bert.encode(["a text", "another one"], batch_size=1, max_length=8, truncate_dim=16)
    got = bert.encode(
        ["a text", "another one"],
        batch_size=np.int64(1),
        max_length=np.int32(8),
        truncate_dim=np.int64(16),
        batch_tokens=np.int64(64),
        normalize=np.bool_(False),
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"threads": 0}, ValueError, r"threads"),
        ({"threads": 1.0}, TypeError, r"threads must be an int >= 1 or None, got 1.0"),
        ({"threads": True}, TypeError, r"threads must be an int >= 1 or None, got True"),
        ({"device": 1.5}, TypeError, r"device must be a str or a torch.device"),
        ({"device": "gpu"}, ValueError, r"device 'gpu' is not valid"),
        ({"dtype": torch.int32}, ValueError, r"dtype.* use one of float32"),
        ({"backend": 3}, TypeError, r"backend must be"),
    ],
)
def test_load_names_the_argument(tiny_checkpoint, kwargs, error, message):
    with pytest.raises(error, match=message):
        Bert.load(tiny_checkpoint, **kwargs)


def test_load_takes_a_numpy_thread_count(tiny_checkpoint):
    assert Bert.load(tiny_checkpoint, threads=np.int64(1)).threads.threads == 1


@pytest.mark.slow
def test_attention_steps_on_the_real_checkpoint_takes_numpy_layers(minilm_dir):
    """The issue's case: all-MiniLM-L6-v2 has layers 0..5, and layer=np.int64(2) was refused
    as "out of range: 0..5"; "2" and 2.0 were called out of range too."""
    real = Bert.load(minilm_dir, threads=1)
    text = "The animal didn't cross the street because it was too tired."
    steps = real.attention_steps(text, layer=np.int64(2), head=np.int64(11), query="animal")
    plain = real.attention_steps(text, layer=2, head=11, query="animal")
    assert (steps.layer, steps.head) == (2, 11)
    assert torch.equal(steps.weights, plain.weights) and steps.query == plain.query
    for bad in ("2", 2.0):
        with pytest.raises(TypeError, match=r"layer must be an int in 0\.\.5"):
            real.attention_steps(text, layer=bad, head=0, query=0)


def test_model_constructor_and_compute_dtype_name_the_argument():
    from tiny_bert import TINY

    from bertattn import BertConfig

    with pytest.raises(TypeError, match="config must be a BertConfig, got dict"):
        BertModel(dict(TINY))
    with pytest.raises(TypeError, match="add_pooling_layer must be True or False"):
        BertModel(BertConfig(**TINY), add_pooling_layer="no")
    model = BertModel(BertConfig(**TINY))
    with pytest.raises(ValueError, match=r"dtype=torch.int32 is not supported; use one of float32"):
        model.to_compute_dtype(torch.int32)
    assert model.to_compute_dtype("float64").dtype == torch.float64
