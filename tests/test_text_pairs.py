"""Texts and text pairs as the head classes and the sentence-transformers integration read a
batch of inputs: one reader (``bertattn.arguments.split_pairs``), each caller's own refusal
message for an item that is neither."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bertattn.arguments import is_text_pair, split_pairs
from bertattn.heads.cross_encoder import _split
from bertattn.heads.sparse import _inputs


def _refuse(i: int, item: object) -> ValueError:
    return ValueError(f"item {i}: {item!r}")


def test_is_text_pair():
    assert is_text_pair(("a", "b")) and is_text_pair(["a", "b"])
    assert not is_text_pair(("a",)) and not is_text_pair(("a", "b", "c"))
    assert not is_text_pair(("a", 1)) and not is_text_pair("ab") and not is_text_pair(None)


def test_split_pairs_texts_and_pairs():
    assert split_pairs(["a", ("b", "c"), ["d", "e"]], _refuse) == (
        ["a", "b", "d"],
        [None, "c", "e"],
    )
    assert split_pairs([], _refuse) == ([], [])


def test_split_pairs_one_text_lists_only_when_asked():
    assert split_pairs([["a"], ("b", "c")], _refuse, one_text_lists=True) == (
        ["a", "b"],
        [None, "c"],
    )
    with pytest.raises(ValueError, match=r"^item 0: \['a'\]$"):
        split_pairs([["a"], ("b", "c")], _refuse)


def test_split_pairs_refuses_the_first_bad_item():
    with pytest.raises(ValueError, match=r"^item 1: \('b', 2\)$"):
        split_pairs(["a", ("b", 2), 3], _refuse)


def test_cross_encoder_message():
    assert _split(["q", ("q", "p"), ["t"]]) == (["q", "q", "t"], [None, "p", None])
    with pytest.raises(ValueError, match=r"^input 1 is 7 \(an int\); expected a text or a "):
        _split(["q", 7])


def test_sparse_message():
    assert _inputs(["a", ["b", "c"]]) == (["a", "b"], [None, "c"], False)
    with pytest.raises(
        TypeError,
        match=r"^sentences\[1\] must be a string or a \[text, pair\] list of two strings, got "
        r"\('b',\) \(a tuple\)\.$",
    ):
        _inputs(["a", ("b",)])


def test_sentence_transformers_integration_message():
    pytest.importorskip("sentence_transformers")
    from bertattn.integrations.sentence_transformers import BertattnTransformer

    plain = SimpleNamespace(do_lower_case=False)
    assert BertattnTransformer._texts(plain, [("A", "B"), ("C", "D")], "p: ") == (
        ["p: A", "p: C"],
        ["B", "D"],
    )
    assert BertattnTransformer._texts(plain, ["A", "C"], None) == (["A", "C"], None)
    with pytest.raises(ValueError, match=r"^mix of single texts and text pairs in one batch"):
        BertattnTransformer._texts(plain, ["A", ("B", "C")], None)
    with pytest.raises(
        ValueError,
        match=r"^inputs\[1\] is a int; BertattnTransformer takes texts \(str\) or text pairs "
        r"\(a tuple of two str\)\.$",
    ):
        BertattnTransformer._texts(plain, ["A", 3], None)
