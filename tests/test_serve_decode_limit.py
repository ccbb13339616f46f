"""``POST /decode`` is bounded (the hostile round's 3M ids, a 15 MB body, held the interpreter and
so /live for 1.7-2.5 s): more than ``max_decode_ids`` ids in one request is a 413 naming the
limit and its option, before any id is looked at; a long decode runs off the event loop."""

from __future__ import annotations

import json

import pytest
from test_serve_units import _raw_post


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):  # type: ignore[no-untyped-def]
    from bertattn import Bert

    return Bert.load(tiny_checkpoint, threads=1)


def _decode(bert, body: dict, **limits: object) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    from bertattn.serve import create_app

    app = create_app(bert, **limits)
    try:
        return _raw_post(
            app, [{"type": "http.request", "body": json.dumps(body).encode()}], "/decode"
        )
    finally:
        app.state.serve.batcher.stop(10)


@pytest.mark.parametrize(
    "ids", [[7] * 101, [[7] * 60, [7] * 41], [[5, 6]] * 51], ids=["one-list", "two", "many"]
)
def test_more_ids_than_the_limit_is_413_naming_it(bert, ids):
    status, answer = _decode(bert, {"ids": ids}, max_decode_ids=100)
    assert status == 413, answer
    error = answer["error"]
    assert error["param"] == "ids" and error["code"] == "request_too_large"
    assert error["message"] == (
        f"'ids' holds {101 if len(ids) != 51 else 102} token ids, more than this server "
        "decodes in one request (100, --max-decode-ids): split them over several requests."
    )


def test_the_count_comes_before_the_ids_are_checked(bert):
    status, answer = _decode(bert, {"ids": [10**9] * 101}, max_decode_ids=100)  # not in vocab
    assert status == 413 and "--max-decode-ids" in answer["error"]["message"], answer


def test_within_the_limit_the_ids_are_decoded(bert):
    ids = bert.tokenizer.encode_batch(["the attention head"])[0].ids
    status, answer = _decode(bert, {"ids": [ids] * 2}, max_decode_ids=2 * len(ids))
    assert status == 200, answer
    assert answer == [bert.tokenizer.decode(ids, skip_special_tokens=True)] * 2


def test_the_default_and_a_bad_limit():
    from bertattn.serve import Limits

    assert Limits().max_decode_ids == 65536
    with pytest.raises(ValueError, match=r"^max_decode_ids must be a positive int, got 0\.$"):
        Limits(max_decode_ids=0)
