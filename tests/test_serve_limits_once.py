"""Each serve limit is checked once: :class:`bertattn.serve.Limits` (the library) and
``bertattn serve`` (the command line) refuse the same bad limit with the same sentence, each
naming it as its caller writes it (``max_queue_tokens=100`` / ``--max-queue-tokens 100``)."""

from __future__ import annotations

import pytest

from bertattn.serve_defaults import check_limits, check_model_length

# (keyword arguments, the same as flags, the library's message written out)
BAD = [
    (
        {"max_decode_ids": 0},
        ["--max-decode-ids", "0"],
        "max_decode_ids must be a positive int, got 0.",
    ),
    (
        {"max_batch_tokens": -3},
        ["--max-batch-tokens", "-3"],
        "max_batch_tokens must be a positive int, got -3.",
    ),
    (
        {"max_queue_tokens": 100},
        ["--max-queue-tokens", "100"],
        "max_queue_tokens=100 is less than max_batch_tokens=16384: the queue could never fill "
        "one batch; raise max_queue_tokens or lower max_batch_tokens.",
    ),
    (
        {"max_input_tokens": 2},
        ["--max-input-tokens", "2"],
        "max_input_tokens must be an integer >= 3, got 2 ([CLS], [SEP] and at least one token "
        "of the text).",
    ),
    (
        {"max_input_tokens": 512, "max_batch_tokens": 256},
        ["--max-input-tokens", "512", "--max-batch-tokens", "256"],
        "max_input_tokens=512 is more than max_batch_tokens=256: one input must fit in a batch.",
    ),
    (
        {"min_queue_requests": -1},
        ["--min-queue-requests", "-1"],
        "min_queue_requests must be an integer >= 0, got -1.",
    ),
]


def _as_flags(message: str) -> str:
    """``message`` with each limit named as the command line names it."""
    for name in ("max_batch_tokens", "max_queue_tokens", "max_input_tokens", "max_decode_ids",
                 "min_queue_requests"):  # fmt: skip
        flag = "--" + name.replace("_", "-")
        message = message.replace(f"{name}=", f"{flag} ").replace(name, flag)
    return message


@pytest.mark.parametrize("kwargs, argv, message", BAD)
def test_the_library_and_the_command_line_give_one_message(cli, kwargs, argv, message):
    from bertattn.serve import Limits

    with pytest.raises(ValueError) as caught:
        Limits(**kwargs)
    assert str(caught.value) == message
    r = cli("serve", "--model", "/nonexistent/model", *argv)  # refused before any loading
    assert r.code == 2, r
    assert r.err.strip() == f"bertattn serve: error: {_as_flags(message)}", r.err


def test_the_model_length_check_is_shared(cli, tiny_checkpoint):
    from bertattn import Bert
    from bertattn.serve import create_app

    bert = Bert.load(tiny_checkpoint, threads=1)  # max length 128
    cases = [
        ({"max_input_tokens": 1000}, ["--max-input-tokens", "1000"],
         "max_input_tokens=1000 is more than the model takes (128 tokens); use "
         "max_input_tokens=128 or less."),
        ({"max_batch_tokens": 100}, ["--max-batch-tokens", "100"],
         "max_batch_tokens=100 is less than the longest input, 128 tokens (the model's max "
         "length): one input must fit in a batch; use max_batch_tokens=128 or more, or a lower "
         "max_input_tokens."),
    ]  # fmt: skip
    for kwargs, argv, message in cases:
        with pytest.raises(ValueError) as caught:
            create_app(bert, **kwargs)
        assert str(caught.value) == message
        r = cli("serve", "--model", tiny_checkpoint, "--port", "0", *argv)
        assert r.code == 2, r
        assert r.err.strip() == f"bertattn serve: error: {_as_flags(message)}", r.err


def test_the_checks_leave_good_limits_alone():
    check_limits({"max_batch_tokens": 128, "max_queue_tokens": 128, "max_input_tokens": None})
    assert check_model_length(None, 512, 128) == 128
    assert check_model_length(64, 64, 128) == 64
    with pytest.raises(ValueError, match="max_queue_tokens=10 is less than max_batch_tokens=20"):
        check_limits({"max_batch_tokens": 20, "max_queue_tokens": 10})
