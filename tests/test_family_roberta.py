"""RoBERTa and XLM-RoBERTa checkpoints in the same encoder: random ``RobertaModel`` /
``XLMRobertaModel`` (tiny sizes, seeded noise on every parameter) saved with
``save_pretrained``, with tokenizers trained for the test by ``tokenizers`` (byte-level BPE for
RoBERTa, SentencePiece Unigram for XLM-RoBERTa, no real one being installable here): hidden
states within 1e-5 of transformers' on padded batches and text pairs, ``Bert.encode`` equal to
sentence-transformers on the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from family_helpers import (
    PAIRS,
    SENTENCES,
    TEXTS,
    assert_encode_equals_sentence_transformers,
    assert_reranker_equals_peers,
    save_with_seeded_head,
)
from tiny_bert import save_random

from bertattn import Bert, BertModel

CORPUS = [*SENTENCES, "un modèle multilingue lit aussi le français"] * 20
SIZES = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
)  # fmt: skip


def _bpe(folder: Path) -> int:
    from tokenizers import ByteLevelBPETokenizer, processors

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        CORPUS, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def _unigram(folder: Path) -> int:
    from tokenizers import SentencePieceUnigramTokenizer, processors

    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(
        CORPUS, vocab_size=200, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        unk_token="<unk>",
    )  # fmt: skip
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def save_family(kind: str, folder: Path, seed: int = 0) -> Path:
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _bpe(folder) if kind == "roberta" else _unigram(folder)
    cls_name = "Roberta" if kind == "roberta" else "XLMRoberta"
    config = getattr(transformers, f"{cls_name}Config")(vocab_size=vocab, **SIZES)
    save_random(getattr(transformers, f"{cls_name}Model"), config, folder, seed)
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "sep_token": "</s>", "cls_token": "<s>", "pad_token": "<pad>",
                "mask_token": "<mask>"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": f"{cls_name}Tokenizer", "model_max_length": 128, **specials})
    )
    return folder


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta"])
def family(request, tmp_path_factory) -> Path:
    return save_family(request.param, tmp_path_factory.mktemp(request.param))


def test_hidden_states_equal_transformers(family):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(family)
    theirs = transformers.AutoModel.from_pretrained(family).eval()
    ours = BertModel.from_pretrained(family)
    for batch in (
        tok(TEXTS, padding=True, return_tensors="pt"),
        tok(TEXTS[:2], PAIRS, padding=True, return_tensors="pt"),
    ):
        with torch.no_grad():
            want = theirs(**batch)
            got = ours(batch["input_ids"], batch["attention_mask"])
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(
            got.last_hidden_state[real], want.last_hidden_state[real], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=1e-5)


def test_our_tokenizer_gives_transformers_ids(family):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(family)
    bert = Bert.load(family, threads=1)
    ours = bert.tokenizer.encode_batch(TEXTS[:2], PAIRS)
    theirs = tok(TEXTS[:2], PAIRS)["input_ids"]
    assert [e.ids for e in ours] == theirs
    assert bert.tokenizer.pad_token_id == 1


def test_encode_equals_sentence_transformers(family, tmp_path):
    assert_encode_equals_sentence_transformers(family, 32, TEXTS, tmp_path)


@pytest.mark.parametrize("kind", ["xlm-roberta", "roberta"])
def test_a_roberta_reranker_is_a_cross_encoder(kind, tmp_path):
    """An XLM-RoBERTa reranker (the bge-reranker kind): its classification head (dense + tanh
    on <s>, then out_proj) is BERT's pooler and classifier."""
    import transformers

    folder = save_family(kind, tmp_path / "base")
    cls_name = "Roberta" if kind == "roberta" else "XLMRoberta"
    config = getattr(transformers, f"{cls_name}Config").from_pretrained(folder, num_labels=1)
    model = getattr(transformers, f"{cls_name}ForSequenceClassification").from_pretrained(
        folder, config=config
    )
    pairs = [(TEXTS[0], PAIRS[0]), (TEXTS[1], PAIRS[1]), (TEXTS[2], TEXTS[0])]
    assert_reranker_equals_peers(model, folder, 1, pairs, tmp_path)


@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words")
@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_a_roberta_tagger_like_transformers(strategy, tmp_path):
    """Token classification on a byte-level BPE vocabulary: words are told apart by spaces
    (transformers' rule where pieces carry no ``##``), offsets into the text."""
    import transformers

    import bertattn

    folder = save_family("roberta", tmp_path / "base")
    labels = dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]))
    config = transformers.RobertaConfig.from_pretrained(
        folder, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model = transformers.RobertaForTokenClassification.from_pretrained(folder, config=config)
    save_with_seeded_head(model, tmp_path / "tagger", 2, folder)
    texts = ["the attention head looks at every token", "queries, keys and values: softmax"]
    theirs = transformers.pipeline("token-classification", model=str(tmp_path / "tagger"))
    ours = bertattn.pipeline("token-classification", tmp_path / "tagger")
    got, want = (
        ours(texts, aggregation_strategy=strategy),
        theirs(texts, aggregation_strategy=strategy),
    )
    assert sum(map(len, got)) > 2
    for g_row, w_row in zip(got, want, strict=True):
        assert [{k: v for k, v in e.items() if k != "score"} for e in g_row] == [
            {
                k: (int(v) if k in ("start", "end", "index") else v)
                for k, v in e.items()
                if k != "score"
            }
            for e in w_row
        ]
        np.testing.assert_allclose(
            [e["score"] for e in g_row], [e["score"] for e in w_row], atol=1e-5
        )
