"""``bertattn.CrossEncoder`` against its oracles on the same weights: transformers'
``BertForSequenceClassification`` logits, and sentence-transformers' ``CrossEncoder``
``predict`` / ``rank`` (scores within 1e-5, identical rankings) — on the tiny random model with
random heads (one label, three labels), on folders saved by transformers and by
sentence-transformers, and (slow tier) on the real all-MiniLM-L6-v2 encoder with a random head.
No fine-tuned BERT cross-encoder ships in a package this project can install, so the heads are
random with a fixed seed, moved well away from zero so that a swapped or dropped tensor shows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import CrossEncoder
from bertattn.errors import ModelFolderError

# one pair of PAIRS is cut to max_length on purpose (as transformers cuts it: longest first)
pytestmark = pytest.mark.filterwarnings("ignore:1 of .* were truncated")

PAIRS = [
    ("the attention head", "looks at every token in the sentence"),
    ("hello", "the first text is short"),
    ("bert model layer", "hello"),
    ("a sentence and a word", " ".join(["token"] * 200)),  # cut to max_length, longest first
    ("ok", ""),
]
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")


def save_classifier(base: Path, out: Path, num_labels: int, seed: int, **config: object) -> Path:
    """A ``BertForSequenceClassification`` on ``base``'s encoder with a random head (seeded,
    N(0, 1): logits far from zero), saved by transformers with ``base``'s tokenizer."""
    import transformers

    cfg = transformers.BertConfig.from_pretrained(base, num_labels=num_labels, **config)
    model = transformers.BertForSequenceClassification.from_pretrained(base, config=cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (*model.classifier.parameters(), *model.bert.pooler.parameters()):
            p.copy_(torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (base / name).exists():
            shutil.copy(base / name, out / name)
    return out


@pytest.fixture(scope="module")
def reranker(tiny_checkpoint, tmp_path_factory) -> Path:
    return save_classifier(tiny_checkpoint, tmp_path_factory.mktemp("rr"), 1, seed=3)


@pytest.fixture(scope="module")
def three_labels(tiny_checkpoint, tmp_path_factory) -> Path:
    id2label = {0: "contradiction", 1: "entailment", 2: "neutral"}
    return save_classifier(
        tiny_checkpoint, tmp_path_factory.mktemp("nli"), 3, seed=4, id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )  # fmt: skip


def hf_logits(folder: Path, pairs) -> torch.Tensor:  # type: ignore[no-untyped-def]
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    firsts = [p[0] if isinstance(p, tuple) else p for p in pairs]
    seconds = [p[1] for p in pairs] if isinstance(pairs[0], tuple) else None
    batch = tok(firsts, seconds, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits  # (N, num_labels)


def st_cross_encoder(folder: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import CrossEncoder as STCrossEncoder

    return STCrossEncoder(str(folder), device="cpu")


def test_logits_equal_transformers_on_pairs_and_texts(reranker, three_labels):
    for folder in (reranker, three_labels):
        ce = CrossEncoder(folder, threads=1)
        torch.testing.assert_close(ce.logits(PAIRS), hf_logits(folder, PAIRS), atol=1e-5, rtol=0)
        texts = [p[0] for p in PAIRS]
        torch.testing.assert_close(ce.logits(texts), hf_logits(folder, texts), atol=1e-5, rtol=0)
    assert CrossEncoder(three_labels).id2label == {
        0: "contradiction", 1: "entailment", 2: "neutral"
    }  # fmt: skip


def test_predict_and_rank_equal_sentence_transformers(reranker):
    ours, theirs = CrossEncoder(reranker, threads=1), st_cross_encoder(reranker)
    want = theirs.predict(PAIRS)
    got = ours.predict(PAIRS)
    assert got.shape == want.shape == (len(PAIRS),) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert not np.allclose(got, 0.5, atol=0.05)  # a real head, not a near-zero one
    np.testing.assert_allclose(ours.predict(PAIRS[0]), theirs.predict(PAIRS[0]), atol=1e-5)
    raw = ours.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_tensor=True)
    torch.testing.assert_close(raw, hf_logits(reranker, PAIRS)[:, 0], atol=1e-5, rtol=0)
    docs = [p[1] for p in PAIRS]
    mine = ours.rank("the attention head", docs, return_documents=True)
    ref = theirs.rank("the attention head", docs, return_documents=True)
    assert [r["corpus_id"] for r in mine] == [r["corpus_id"] for r in ref]
    assert [r["text"] for r in mine] == [r["text"] for r in ref]
    np.testing.assert_allclose([r["score"] for r in mine], [r["score"] for r in ref], atol=1e-5)
    top = ours.rank("the attention head", docs, top_k=2)
    assert top == [{k: r[k] for k in ("corpus_id", "score")} for r in mine[:2]]


def test_several_labels_softmax_and_activation_like_sentence_transformers(three_labels):
    ours, theirs = CrossEncoder(three_labels, threads=1), st_cross_encoder(three_labels)
    got, want = ours.predict(PAIRS), theirs.predict(PAIRS)
    assert got.shape == (len(PAIRS), 3)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)  # identity: the logits
    soft = ours.predict(PAIRS, apply_softmax=True)
    np.testing.assert_allclose(soft, theirs.predict(PAIRS, apply_softmax=True), atol=1e-5)
    np.testing.assert_allclose(soft.sum(axis=1), 1.0, atol=1e-6)
    listed = ours.predict(PAIRS, convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == len(PAIRS)
    with pytest.raises(ValueError, match="one label"):
        ours.rank("q", ["a", "b"])


def test_folder_saved_by_sentence_transformers_and_its_activation(reranker, tmp_path):
    theirs = st_cross_encoder(reranker)
    theirs.activation_fn = torch.nn.Identity()  # saved into the folder, read back by both
    theirs.save(str(tmp_path / "st"))
    folder = tmp_path / "st"
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert settings["activation_fn"].endswith("Identity")
    ours = CrossEncoder(folder, threads=1)
    got = ours.predict(PAIRS)
    np.testing.assert_allclose(got, st_cross_encoder(folder).predict(PAIRS), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, hf_logits(reranker, PAIRS)[:, 0].numpy(), atol=1e-5, rtol=0)


def test_unknown_activation_warns_and_uses_the_default(reranker, tmp_path):
    folder = tmp_path / "odd"
    shutil.copytree(reranker, folder)
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"activation_fn": "mypackage.Evil"})
    )
    with pytest.warns(UserWarning, match="mypackage.Evil"):
        ce = CrossEncoder(folder)
    np.testing.assert_allclose(
        ce.predict(PAIRS), torch.sigmoid(hf_logits(reranker, PAIRS)[:, 0]).numpy(), atol=1e-5
    )


def test_a_model_without_the_head_is_refused_by_name(tiny_checkpoint, reranker, tmp_path):
    with pytest.raises(ModelFolderError, match="architectures is BertModel.*BertForSequence"):
        CrossEncoder(tiny_checkpoint)
    broken = tmp_path / "broken"
    shutil.copytree(reranker, broken)
    from safetensors.torch import load_file, save_file

    state = load_file(broken / "model.safetensors")
    del state["classifier.bias"]
    state["classifier.extra"] = torch.zeros(2)
    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match="missing classifier.bias.*unexpected classifier"):
        CrossEncoder(broken)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ce: ce.predict(["a", "b", "c"]), "input 0 is .*wrap single texts"),
        (lambda ce: ce.predict([("a", 1)]), r"input 0 is .*\(text, text\) pair"),
        (lambda ce: ce.predict(PAIRS, batch_size=0), "batch_size"),
        (lambda ce: ce.rank("q", ["a"], top_k=0), "top_k"),
        (lambda ce: ce.rank("q", "a document"), "documents must be a list"),
        (lambda ce: ce.rank("q", ["a", 3]), r"documents\[1\]"),
    ],
)
def test_bad_input_is_named(reranker, call, message):
    ce = CrossEncoder(reranker)
    with pytest.raises((ValueError, TypeError), match=message):
        call(ce)


def test_empty_inputs(reranker):
    ce = CrossEncoder(reranker)
    assert ce.predict([]).shape == (0,)
    assert ce.rank("q", []) == []


@pytest.mark.slow
def test_minilm_encoder_with_a_random_head_equals_transformers(minilm_dir, tmp_path):
    folder = save_classifier(minilm_dir, tmp_path / "minilm-rr", 1, seed=5)
    ce = CrossEncoder(folder)
    want = hf_logits(folder, PAIRS)  # |logits| ~ 10-30 with an N(0, 1) head on 384 features:
    # float32 sums over 384 terms agree to ~1e-6 of that size, so the bound is relative too
    torch.testing.assert_close(ce.logits(PAIRS), want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(
        ce.predict(PAIRS), st_cross_encoder(folder).predict(PAIRS), atol=1e-5, rtol=0
    )


def test_rank_long_documents_by_their_best_window(reranker):
    """A document longer than the window is scored in overlapping windows of its own tokens
    (a quarter overlap, the last ending at the document's end) and takes the best; the oracle
    is transformers on each window's text (every word here is one token, so a window's text
    tokenizes to the same tokens)."""
    ce = CrossEncoder(reranker, threads=1)
    ce.predict(PAIRS)  # the tokenizer's truncation is now set: windows must read past it
    words = "the attention head looks at every token in sentence and weighs it".split()
    long_doc = " ".join(words[i % len(words)] for i in range(300))  # 300 tokens > 128
    short = "hello world"
    query = "bert model layer"
    size = 40
    step = size - size // 4
    doc_words = long_doc.split()
    starts = list(range(0, len(doc_words) - size + step, step))
    if starts[-1] + size < len(doc_words):
        starts.append(len(doc_words) - size)
    windows = [" ".join(doc_words[s : s + size]) for s in starts]
    assert len(windows) > 5 and windows[-1].endswith(doc_words[-1])
    want = torch.sigmoid(hf_logits(reranker, [(query, w) for w in windows])[:, 0]).max()
    want_short = torch.sigmoid(hf_logits(reranker, [(query, short)])[0, 0])
    got = ce.rank(query, [long_doc, short], max_tokens_per_doc=size)
    scores = {r["corpus_id"]: r["score"] for r in got}
    assert scores[0] == pytest.approx(float(want), abs=1e-5)
    assert scores[1] == pytest.approx(float(want_short), abs=1e-5)  # one window: the pair
    cut = ce.rank(query, [long_doc, short])  # without windows: cut at max_length
    first = torch.sigmoid(hf_logits(reranker, [(query, long_doc)])[0, 0])
    assert {r["corpus_id"]: r["score"] for r in cut}[0] == pytest.approx(float(first), abs=1e-5)
    with pytest.raises(ValueError, match="max_tokens_per_doc"):
        ce.rank(query, [short], max_tokens_per_doc=0)
