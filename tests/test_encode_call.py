"""``Bert.encode``'s signature is written once (:mod:`bertattn.encoder.encode_call`) and its
options travel as one grouped, checked :class:`EncodeCall`."""

from __future__ import annotations

import inspect

import pytest

from bertattn import Bert
from bertattn.encoder.encode_call import (
    ENCODE,
    ST_ENCODE,
    Batching,
    EncodeCall,
    Output,
    Pooled,
    arguments,
)
from bertattn.encoder.st_compat import UnsupportedArgumentError


def test_the_methods_show_the_one_signature():
    assert inspect.signature(Bert.encode) == ENCODE
    assert inspect.signature(Bert.encode_query) == inspect.signature(Bert.encode_document)
    assert inspect.signature(Bert.encode_query) == ST_ENCODE
    st = list(ST_ENCODE.parameters)
    mine = list(ENCODE.parameters)
    assert mine[: len(st) - 1] == st[:-1] and mine[-1] == st[-1] == "kwargs"
    assert mine[len(st) - 1 : -1] == ["pooling", "normalize", "max_length", "progress",
                                      "batch_tokens"]  # fmt: skip
    assert all(ENCODE.parameters[n].kind is inspect.Parameter.KEYWORD_ONLY for n in mine[15:-1])


def test_arguments_fill_the_defaults_and_keep_the_rest():
    given = arguments(ENCODE, object(), ("a text", None, "query: "), {"pooling": "cls", "x": 1})
    assert given["inputs"] == "a text" and given["prompt"] == "query: "
    assert given["batch_size"] == 32 and given["output_value"] == "sentence_embedding"
    assert given["pooling"] == "cls" and given["kwargs"] == {"x": 1}
    with pytest.raises(TypeError, match=r"^encode\(\): missing a required argument: 'inputs'\.$"):
        arguments(ENCODE, object(), (), {})


def test_the_loop_takes_every_keyword_of_a_call():
    call = EncodeCall(Batching(), Pooled(), Output(), prompt=None)
    loop = inspect.signature(Bert._encode).parameters
    assert set(call.loop_keywords()) <= set(loop)
    with pytest.raises(AttributeError):
        call.prompt = "frozen"  # type: ignore[misc]


def test_an_unknown_keyword_is_refused_naming_every_parameter(tiny_checkpoint):
    bert = Bert.load(tiny_checkpoint, threads=1)
    with pytest.raises(UnsupportedArgumentError) as caught:
        bert.encode(["hi"], colour="red")
    assert str(caught.value) == (
        "Bert.encode() got keyword argument(s) it does not take: colour. It takes "
        "sentence-transformers' encode parameters (prompt_name, prompt, batch_size, "
        "show_progress_bar, output_value, precision, convert_to_numpy, convert_to_tensor, "
        "device, normalize_embeddings, truncate_dim) and bertattn's (pooling, normalize, "
        "max_length, progress, batch_tokens)."
    )
    a = bert.encode(["hi", "there"], None, None, 1, False, pooling="cls", max_length=5)
    b = bert.encode(inputs=["hi", "there"], batch_size=1, pooling="cls", max_length=5)
    assert a.shape == (2, 32) and (a == b).all()
    q = bert.encode_query(sentences=["hi"], pooling="cls")  # bertattn's keywords pass through
    assert (q == bert.encode(["hi"], pooling="cls", task="query")).all()
