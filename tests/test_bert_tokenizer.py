"""BertTokenizer: tokenizer.json vs vocab.txt, truncation reports, pairs."""

from __future__ import annotations

import logging
import shutil

import pytest

from bertattn.encoder import BertTokenizer

TEXTS = [
    "Héllo, World! Naïve café owners don't tokenize 日本語 easily.",
    "unaffable   preprocessing\tof\u200bzero-width text",
    "",
    "BERT's [MASK] token and [UNK] stay whole.",
]


@pytest.fixture(scope="module")
def from_json(minilm_dir):
    return BertTokenizer.from_folder(minilm_dir)


@pytest.fixture(scope="module")
def from_vocab(minilm_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab_only")
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, d / name)
    assert not (d / "tokenizer.json").exists()
    return BertTokenizer.from_folder(d)


def test_vocab_only_matches_tokenizer_json(from_json, from_vocab):
    a, b = from_json(TEXTS), from_vocab(TEXTS)
    assert a.input_ids.tolist() == b.input_ids.tolist()
    assert a.tokens == b.tokens
    pa, pb = from_json(TEXTS, TEXTS[::-1]), from_vocab(TEXTS, TEXTS[::-1])
    assert pa.input_ids.tolist() == pb.input_ids.tolist()
    assert pa.token_type_ids.tolist() == pb.token_type_ids.tolist()


def test_matches_transformers_tokenizer(from_json, minilm_dir):
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    ours = from_json(TEXTS, TEXTS[::-1])
    theirs = ref(TEXTS, TEXTS[::-1], padding=True)
    assert ours.input_ids.tolist() == theirs["input_ids"]
    assert ours.token_type_ids.tolist() == theirs["token_type_ids"]
    assert ours.attention_mask.tolist() == theirs["attention_mask"]


def test_pair_token_type_ids(from_json):
    batch = from_json(["the cat"], ["sat down"])
    assert batch.tokens[0] == ["[CLS]", "the", "cat", "[SEP]", "sat", "down", "[SEP]"]
    assert batch.token_type_ids[0].tolist() == [0, 0, 0, 0, 1, 1, 1]


def test_padding_and_mask(from_json):
    batch = from_json(["a", "a b c d"])
    assert batch.input_ids.shape == (2, 6)
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert batch.input_ids[0, 3:].tolist() == [from_json.pad_token_id] * 3


def test_truncation_is_reported(from_json, caplog):
    with (
        caplog.at_level(logging.INFO, logger="bertattn.encoder"),
        pytest.warns(
            UserWarning,
            match=r"2 of 3 inputs were longer than max_length=5 tokens and were truncated",
        ),
    ):
        batch = from_json(["one two three four", "a", "one two three four five"], max_length=5)
    assert batch.num_truncated == 2
    assert batch.input_ids.shape == (3, 5)
    assert batch.tokens[0] == ["[CLS]", "one", "two", "three", "[SEP]"]
    assert "2 of 3 inputs" in caplog.text


def test_default_limit_is_model_max_length(from_json):
    assert from_json.model_max_length == 512
    with pytest.warns(UserWarning, match="1 of 1 inputs"):
        assert from_json(["word " * 600]).input_ids.shape == (1, 512)


def test_errors(from_json, tmp_path):
    with pytest.raises(ValueError, match="wrap a single text in a list"):
        from_json("just a string")
    with pytest.raises(ValueError, match="2 texts but 1 pairs"):
        from_json(["a", "b"], ["c"])
    with pytest.raises(FileNotFoundError, match="no tokenizer.json and no vocab.txt"):
        BertTokenizer.from_folder(tmp_path)


def test_length_batches_respect_count_and_token_budget() -> None:
    from bertattn.encoder.pipeline import length_batches

    lengths = [10, 9, 9, 5, 5, 5, 1]  # sorted longest first, as Bert.encode sorts them
    assert length_batches(lengths, 32) == [(0, 7)]
    assert length_batches(lengths, 2) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    # a range of n texts pads to n * its first length: 2 * 10 = 20 fits, 3 * 10 does not
    assert length_batches(lengths, 32, batch_tokens=20) == [(0, 2), (2, 4), (4, 7)]
    assert length_batches(lengths, 32, batch_tokens=1) == [(i, i + 1) for i in range(7)]


def test_length_batches_fill_short_ranges_past_the_count() -> None:
    from bertattn.encoder.pipeline import length_batches

    lengths = [10, 9, 9, 5, 5, 5, 1]
    assert length_batches(lengths, 2, fill_tokens=0) == length_batches(lengths, 2)
    # past 2 texts while n * the range's first length <= 20: 2 x 10 (the count is reached,
    # 3 x 10 > 20), 2 x 9 (3 x 9 > 20), then 3 x 5 <= 20, 4 x 5 = 20 takes the 1 too
    assert length_batches(lengths, 2, fill_tokens=20) == [(0, 2), (2, 4), (4, 7)]
    assert length_batches(lengths, 2, fill_tokens=70) == [(0, 7)]  # 7 x 10
    # the cap still caps: a fill above batch_tokens fills no further than the cap
    assert length_batches(lengths, 2, batch_tokens=20, fill_tokens=70) == [(0, 2), (2, 4), (4, 7)]
    # one text a range is asked for, and a long text is never joined by a short one past it
    assert length_batches([300, 3, 3, 3], 1, fill_tokens=256) == [(0, 1), (1, 4)]


def test_two_threads_each_get_their_own_truncation(from_json):
    """The truncation length is the tokenizer's state: two threads encoding with different
    limits at once must each get their own (one thread's call used to cut the other's texts)."""
    import threading

    text = " ".join(["attention"] * 300)
    wrong: list[tuple[int, int]] = []
    start = threading.Barrier(2)

    def run(limit: int) -> None:
        start.wait()
        for _ in range(300):
            n = len(from_json.encode_batch([text] * 8, max_length=limit)[0].ids)
            if n != limit:
                wrong.append((limit, n))

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = [threading.Thread(target=run, args=(k,)) for k in (16, 200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not wrong, f"{len(wrong)} calls cut at another thread's limit, e.g. {wrong[:3]}"


def test_copies_and_pickles_keep_working(from_json):
    import copy
    import pickle

    for other in (copy.deepcopy(from_json), pickle.loads(pickle.dumps(from_json))):
        got = other.encode_batch(["the attention head"], max_length=8)[0].ids
        assert got == from_json.encode_batch(["the attention head"], max_length=8)[0].ids


def _unigram_tokenizer():
    """A tiny SentencePiece-style Unigram tokenizer (XLM-RoBERTa's layout: <unk> is id 3)."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import Unigram

    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0),
             ("▁a", -1.0), ("a", -3.0), ("▁cat", -1.0), ("▁猫", -4.0)]  # fmt: skip
    tok = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    return BertTokenizer(tok, pad_token="<pad>")


def test_a_unigram_vocabulary_knows_its_unknown_token_and_warns_on_it():
    # tokenizers does not show a Unigram model's unk_id as an attribute: it is read from the
    # model's state, so the warning for text the vocabulary does not cover works for
    # SentencePiece vocabularies (XLM-RoBERTa, multilingual-e5) as for WordPiece
    tok = _unigram_tokenizer()
    assert tok.unk_token_id == 3
    assert tok(["a cat 猫"]).tokens[0] == ["<s>", "▁a", "▁cat", "▁猫", "</s>"]
    with pytest.warns(UserWarning, match=r"1 of 2 inputs are mostly unknown tokens"):
        batch = tok(["狗 鸟", "a cat"])
    assert batch.input_ids[0, 1:3].tolist() == [3, 3]
