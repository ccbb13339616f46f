"""A text the model's vocabulary does not cover (Chinese for the English default model: most of
一只猫坐在垫子上 is [UNK]) is said to be so, in the API and on the command line, naming a model that
covers it and the command that makes it; a text it covers is not."""

from __future__ import annotations

import warnings

import pytest

from bertattn import Bert

CHINESE = "一只猫坐在垫子上"


@pytest.fixture(scope="module")
def minilm():  # type: ignore[no-untyped-def]
    return Bert.load(threads=1)


def test_encode_warns_for_a_script_the_vocabulary_does_not_cover(minilm):
    tokens = minilm.tokenizer([CHINESE]).tokens[0]
    assert tokens.count("[UNK]") > len(tokens[1:-1]) / 2  # the premise: mostly [UNK]
    with pytest.warns(
        UserWarning,
        match=r"1 of 2 inputs are mostly unknown tokens.*"
        r"run bertattn get-model multilingual-e5-small",
    ):
        minilm.encode([CHINESE, "a cat sat on the mat"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        minilm.encode(["a cat sat on the mat", "一 cat"])  # covered, or one unknown of two


def test_attend_says_it_on_the_command_line(cli):
    r = cli("attend", CHINESE)
    assert r.code == 0, r
    warning = [line for line in r.err.splitlines() if "mostly unknown tokens" in line]
    assert len(warning) == 1, r.err  # one line, above the summary
    assert "run bertattn get-model multilingual-e5-small" in warning[0]
