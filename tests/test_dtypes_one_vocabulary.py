"""``dtype`` under one vocabulary (:mod:`bertattn.dtypes`): every entry point refuses the same
bad name with the same sentence, naming the argument as its caller spells it and what that
entry point accepts; ``"auto"`` means what the caller names (fastest / checkpoint)."""

from __future__ import annotations

import pytest
import torch

from bertattn import Bert, BertConfig, BertModel
from bertattn.dtypes import AUTO_MEANINGS, COMMAND_LINE, FLOATS, dtype_name, parse_dtype

LIBRARY = "is not a torch dtype; use one of float32, float16, bfloat16, float64"
SUFFIX = " (a torch.dtype or its name)."


def _library_entry_points(folder):
    from tiny_bert import TINY

    model = BertModel(BertConfig(**TINY))
    return [
        ("dtype", ", auto, int8", lambda bad: Bert.load(folder, dtype=bad)),
        ("dtype", ", auto", lambda bad: BertModel.from_pretrained(folder, dtype=bad)),
        ("torch_dtype", ", auto", lambda bad: BertModel.from_pretrained(folder, torch_dtype=bad)),
        ("dtype", "", lambda bad: model.to_compute_dtype(bad)),
    ]


def test_each_library_entry_point_refuses_a_bad_name_with_one_sentence(tiny_checkpoint):
    for name, extra, call in _library_entry_points(tiny_checkpoint):
        with pytest.raises(ValueError) as caught:
            call("float17")
        assert str(caught.value) == f"{name} 'float17' {LIBRARY}{extra}{SUFFIX}"
        with pytest.raises(ValueError) as caught:
            call(torch.int32)
        assert str(caught.value) == (
            f"{name}=torch.int32 is not supported; use one of float32, float16, bfloat16, "
            f"float64{extra}{SUFFIX}"
        )
        with pytest.raises(TypeError) as caught:
            call(3)
        assert str(caught.value) == (
            f"{name} must be one of float32, float16, bfloat16, float64{extra} (a torch.dtype "
            f"or its name), got 3 (an int)."
        )


def test_each_job_refuses_a_bad_name_with_one_sentence():
    from bertattn.errors import UsageError
    from bertattn.jobs.encode_options import EncodeOptions
    from bertattn.jobs.head_options import RerankOptions
    from bertattn.jobs.serve_options import ServeOptions

    made = [
        (", int8", lambda bad: EncodeOptions(input="in.txt", output="o.npy", dtype=bad)),
        (", int8", lambda bad: ServeOptions(dtype=bad)),
        ("", lambda bad: RerankOptions(
            query="q", input="in.jsonl", output="o.jsonl", model="m", dtype=bad
        )),
    ]
    for extra, make in made:
        for bad in ("float17", "float64", "half"):  # the command line takes the names only
            with pytest.raises(UsageError) as caught:
                make(bad)
            assert str(caught.value) == (
                f"--dtype {bad!r} is not one of float32, float16, bfloat16, auto{extra}."
            )


def test_the_command_line_offers_the_one_list(cli):
    from bertattn.jobs.fields import DTYPES, ENCODER_DTYPES

    assert COMMAND_LINE == ("float32", "float16", "bfloat16") and FLOATS[:3] == COMMAND_LINE
    assert DTYPES == (*COMMAND_LINE, "auto") and ENCODER_DTYPES == (*DTYPES, "int8")
    r = cli("encode", "in.txt", "-o", "o.npy", "--dtype", "float17")
    assert r.code == 2 and "invalid choice: 'float17'" in r.err, r


def test_names_resolve_to_torch_dtypes_and_auto_keeps_its_meaning():
    for spelled in ("float16", "torch.float16", "half", " float16 ", torch.float16):
        assert parse_dtype(spelled) is torch.float16
    assert parse_dtype(None) is None and parse_dtype("int8", int8=True) == "int8"
    assert parse_dtype(torch.int8, int8=True) == "int8"
    assert parse_dtype("auto", auto="fastest") == parse_dtype("auto", auto="checkpoint") == "auto"
    with pytest.raises(ValueError, match=r"^dtype 'auto' is not a torch dtype; use one of "):
        parse_dtype("auto")  # an entry point that gives auto no meaning refuses it
    with pytest.raises(ValueError, match=r"^auto must be one of fastest, checkpoint, got 'x'\.$"):
        parse_dtype("auto", auto="x")  # type: ignore[arg-type]
    assert sorted(AUTO_MEANINGS) == ["checkpoint", "fastest"]
    assert [dtype_name(getattr(torch, n)) for n in FLOATS] == list(FLOATS)
