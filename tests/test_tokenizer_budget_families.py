"""A huge text is cut before it is tokenized for RoBERTa's byte-level BPE and XLM-RoBERTa's
SentencePiece Unigram too (it was BERT's WordPiece only: one 12 MB document to a RoBERTa model
took 27 s, and a short request beside it waited as long). The cut changes nothing: the ids,
offsets and the truncated flag equal the whole text's, for texts, pairs and odd cases (runs of
spaces, tabs, punctuation, accents, no space at all); and the 12 MB text costs what a short
one does. Tiny family folders of ``test_family_roberta`` (tokenizers trained for the test)."""

from __future__ import annotations

import time

import pytest
from test_family_roberta import save_family

from bertattn.encoder import BertTokenizer
from bertattn.encoder.budget import TextBudget

WORDS = "the attention head looks at every token, un modèle multilingue lit aussi le français"


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta"])
def folder(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    return save_family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def tokenizer(folder) -> BertTokenizer:  # type: ignore[no-untyped-def]
    return BertTokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def whole(folder):  # type: ignore[no-untyped-def]
    """The encodings of the whole texts, nothing cut before tokenizing (the reference): the
    folder's tokenizer.json read by tokenizers itself."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def encode(texts, pairs=None, limit: int = 64):  # type: ignore[no-untyped-def]
        raw.enable_truncation(limit, strategy="longest_first")
        inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
        return raw.encode_batch(inputs)

    return encode


def test_these_tokenizers_are_cut(folder):
    from tokenizers import Tokenizer

    budget = TextBudget(Tokenizer.from_file(str(folder / "tokenizer.json")))
    assert budget.supported
    long = " ".join([WORDS] * 400)
    assert budget.first_cut(long, 65) is not None


CASES = [
    " ".join([WORDS] * 300),
    ("word  " * 2000) + "end",  # runs of two spaces
    ("a\tb\n" * 3000),  # tabs and newlines, never cut at
    ("!!, ... ;; " * 2000),  # punctuation runs
    "x" * 60000,  # no space at all: tokenized whole
    ("  " * 5000) + WORDS * 100,  # leading spaces
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_cut_text_gives_the_whole_texts_tokens(tokenizer, whole, case):
    text = CASES[case]
    got = tokenizer.encode_batch([text, WORDS], max_length=64)
    want = whole([text, WORDS])
    for g, w in zip(got, want, strict=True):
        assert g.ids == w.ids and g.offsets == w.offsets and g.type_ids == w.type_ids
        assert bool(g.overflowing) == bool(w.overflowing)


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_a_cut_pair_gives_the_whole_pairs_tokens(tokenizer, whole):
    a, b = " ".join([WORDS] * 40), " ".join([WORDS] * 41)  # cut past 65 x 16 characters
    for first, second in ((a, b), (b, a), (a, "short"), ("short", b)):
        for limit in (63, 64):  # an odd and an even room
            got = tokenizer.encode_batch([first], [second], max_length=limit)[0]
            want = whole([first], [second], limit)[0]
            assert got.ids == want.ids and got.type_ids == want.type_ids


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_a_12_mb_text_costs_what_a_short_one_does(tokenizer):
    huge = " ".join([WORDS] * 150_000)  # ~12.8 MB
    assert len(huge) > 12_000_000
    start = time.perf_counter()
    (enc,) = tokenizer.encode_batch([huge], max_length=128)
    took = time.perf_counter() - start
    assert len(enc.ids) == 128 and enc.overflowing
    assert took < 2.0, f"{took:.1f} s: the text was tokenized whole"
    assert tokenizer.count_tokens(huge, most=1000) is None  # "more than": cheap too
