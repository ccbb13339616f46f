"""``max_tokens_per_doc`` windows on every family's tokenizer: the special tokens come from
the tokenizer's own pair template (``<s> q </s></s> d </s>`` for RoBERTa / XLM-RoBERTa, the
bge-reranker kind; ``[CLS] q [SEP] d [SEP]`` for BERT), never looked up by name. A document that
fits one window gives exactly the ids transformers' tokenizer gives the pair, and the score
``predict`` gives it; a long one its best window's. Tiny random-weight family folders
(``test_family_roberta.save_family``: byte-level BPE and SentencePiece Unigram tokenizers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from family_helpers import save_with_seeded_head
from test_family_roberta import save_family
from test_heads_cross_encoder import save_classifier

from bertattn import CrossEncoder
from bertattn.heads.windows import pair_template, pair_windows, plan_windows

QUERY = "the attention head"
DOCS = [
    "looks at every token in the sentence",
    "hello world, a model and a layer",
    " ".join(["queries, keys and values: softmax over the scaled dot products"] * 12),
]


def _family_reranker(kind: str, tmp: Path) -> Path:
    import transformers

    base = save_family(kind, tmp / "base")
    cls_name = "Roberta" if kind == "roberta" else "XLMRoberta"
    config = getattr(transformers, f"{cls_name}Config").from_pretrained(base, num_labels=1)
    model = getattr(transformers, f"{cls_name}ForSequenceClassification").from_pretrained(
        base, config=config
    )
    return save_with_seeded_head(model, tmp / "rr", 4, base)


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta", "bert"])
def reranker(request, tmp_path_factory, tiny_checkpoint) -> Path:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        return save_classifier(tiny_checkpoint, tmp / "rr", 1, seed=3)
    return _family_reranker(request.param, tmp)


def test_the_template_is_the_tokenizers_own(reranker):
    import transformers

    ce = CrossEncoder(reranker, threads=1)
    theirs = transformers.AutoTokenizer.from_pretrained(reranker)
    t = pair_template(ce.bert.tokenizer)
    assert [i for i, _ in t.prefix] == [theirs.cls_token_id]
    assert [i for i, _ in t.suffix] == [theirs.sep_token_id]
    double = theirs.cls_token_id != 101 and ce.bert.model.config.family != "bert"
    assert [i for i, _ in t.middle] == [theirs.sep_token_id] * (2 if double else 1)


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_a_short_document_is_one_window_with_transformers_ids(reranker):
    import transformers

    ce = CrossEncoder(reranker, threads=1)
    theirs = transformers.AutoTokenizer.from_pretrained(reranker)
    for doc in DOCS[:2]:
        (window,) = pair_windows(
            ce.bert.tokenizer, QUERY, doc, max_length=ce.max_length, doc_tokens=64
        )
        want = theirs(QUERY, doc)
        assert window.ids == want["input_ids"]
        if "token_type_ids" in want:
            assert window.type_ids == want["token_type_ids"]
    ranked = ce.rank(QUERY, DOCS[:2], max_tokens_per_doc=64)
    plain = ce.predict([(QUERY, d) for d in DOCS[:2]])
    np.testing.assert_allclose([r["score"] for r in sorted(ranked, key=lambda r: r["corpus_id"])],
                               plain, atol=1e-6)  # fmt: skip


def test_a_long_document_scores_its_best_window(reranker):
    ce = CrossEncoder(reranker, threads=1)
    tok = ce.bert.tokenizer
    windows = pair_windows(tok, QUERY, DOCS[2], max_length=ce.max_length, doc_tokens=16)
    plan = plan_windows(tok, QUERY, DOCS[2], max_length=ce.max_length, doc_tokens=16)
    assert len(windows) == len(plan) > 3
    assert sum(len(w.ids) for w in windows) == plan.tokens
    # every window: the template around the query and 16 of the document's own tokens
    doc_ids = tok.token_ids([DOCS[2]])[0]
    t = pair_template(tok)
    head = len(t.prefix) + len(tok.token_ids([QUERY])[0]) + len(t.middle)
    assert windows[0].ids[head : -len(t.suffix)] == doc_ids[:16]
    last = windows[-1].ids[head : -len(t.suffix)]
    assert 0 < len(last) <= 16 and last == doc_ids[-len(last) :]  # ends at the document's end
    best = float(ce.activation_fn(ce._logits(windows, 8))[:, 0].max())
    (got,) = ce.rank(QUERY, [DOCS[2]], max_tokens_per_doc=16)
    assert got["score"] == pytest.approx(best, abs=1e-6)
