"""Late chunking (``Bert.encode_late_chunks``) on the real all-MiniLM-L6-v2 against
transformers' ``AutoModel``: each span's row is the mean of transformers' token states over the
tokens whose first character lies in the span, from one forward of the whole text (then
L2-normalized, as the folder's Normalize module says); a long text's windows are each run by
transformers on their own, and each token read from the window the documented rule names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertattn import Bert

TEXT = (
    "Berlin is the capital and largest city of Germany. Its population is about 3.7 million. "
    "The city is known for its museums, its nightlife and its history. It was divided from "
    "1961 to 1989."
)
SPANS = [(0, 51), (51, 88), (88, 153), (153, len(TEXT))]


@pytest.fixture(scope="module")
def bert(minilm_dir) -> Bert:
    return Bert.load(minilm_dir, threads=1)


@pytest.fixture(scope="module")
def hf(minilm_dir):  # type: ignore[no-untyped-def]
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    return tok, model


def _normalized(rows: list[torch.Tensor]) -> np.ndarray:
    out = torch.stack(rows)
    return (out / out.norm(dim=1, keepdim=True)).numpy()


def _span_means(states: torch.Tensor, offsets: list[tuple[int, int]], spans) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``states`` (n, E) of the text's tokens, ``offsets`` theirs: mean per span, normalized."""
    rows = []
    for a, b in spans:
        keep = [i for i, (s, _) in enumerate(offsets) if a <= s < b]
        assert keep, (a, b)
        rows.append(states[keep].mean(0))
    return _normalized(rows)


def test_rows_equal_transformers_mean_over_span_tokens(bert, hf, mkl_products):
    tok, model = hf
    enc = tok(TEXT, return_offsets_mapping=True, return_tensors="pt")
    offsets = [tuple(o) for o in enc.pop("offset_mapping")[0].tolist()]
    with torch.no_grad():
        states = model(**enc).last_hidden_state[0]  # (L, E), [CLS] ... [SEP]
    want = _span_means(states[1:-1], offsets[1:-1], SPANS)
    got = bert.encode_late_chunks(TEXT, SPANS)
    assert got.shape == (4, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the chunk sees its context: not the chunk's own embedding
    alone = bert.encode([TEXT[a:b] for a, b in SPANS])
    assert np.abs(got - alone).max() > 1e-2


def test_max_pooling_and_no_normalize(bert, hf, mkl_products):
    tok, model = hf
    enc = tok(TEXT, return_offsets_mapping=True, return_tensors="pt")
    offsets = [tuple(o) for o in enc.pop("offset_mapping")[0].tolist()][1:-1]
    with torch.no_grad():
        states = model(**enc).last_hidden_state[0, 1:-1]
    a, b = SPANS[1]
    keep = [i for i, (s, _) in enumerate(offsets) if a <= s < b]
    got = bert.encode_late_chunks(TEXT, [SPANS[1]], pooling="max", normalize=False)
    np.testing.assert_allclose(got[0], states[keep].amax(0).numpy(), atol=1e-5)
    got = bert.encode_late_chunks(TEXT, [SPANS[1]], normalize=False, convert_to_tensor=True)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got[0].numpy(), states[keep].mean(0).numpy(), atol=1e-5)


def _windows_oracle(n: int, width: int, overlap: int) -> tuple[list[int], list[int]]:
    """Window starts and, per token, the window with the most context on both sides: written
    out here from the documented rule, not taken from bertattn."""
    starts = [0]
    while starts[-1] + width < n:
        starts.append(min(starts[-1] + width - overlap, n - width))
    pick = []
    for i in range(n):
        best, best_ctx = 0, -1
        for w, s in enumerate(starts):
            if s <= i < s + width:
                ctx = min(i - s, s + width - 1 - i)
                if ctx > best_ctx:
                    best, best_ctx = w, ctx
        pick.append(best)
    return starts, pick


@pytest.mark.parametrize(("max_length", "overlap"), [(40, None), (32, 10), (64, 0)])
def test_long_text_windows_against_each_window_forward(bert, hf, max_length, overlap, mkl_products):
    tok, model = hf
    text = " ".join([TEXT] * 3)  # ~130 tokens: several windows of 30-62 tokens
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, offsets = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
    n, width = len(ids), max_length - 2
    ov = width // 2 if overlap is None else overlap
    starts, pick = _windows_oracle(n, width, ov)
    assert len(starts) >= 3
    states = torch.empty(n, 384)
    with torch.no_grad():
        for w, s in enumerate(starts):
            window = [tok.cls_token_id, *ids[s : s + width], tok.sep_token_id]
            h = model(input_ids=torch.tensor([window])).last_hidden_state[0, 1:-1]
            for i in range(s, s + width):
                if pick[i] == w:
                    states[i] = h[i - s]
    spans = [(0, 100), (90, 300), (300, 450), (len(text) - 40, len(text))]
    want = _span_means(states, offsets, spans)
    got = bert.encode_late_chunks(text, spans, max_length=max_length, overlap=overlap)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the windows differ from one forward of the whole text (which fits the model): the
    # test would notice states taken from the wrong window
    whole = bert.encode_late_chunks(text, spans, max_length=256)
    assert np.abs(whole - got).max() > 1e-3


def test_batch_size_does_not_change_rows(bert):
    text = " ".join([TEXT] * 3)
    spans = [(0, 200), (200, len(text))]
    one = bert.encode_late_chunks(text, spans, max_length=32, batch_size=1)
    many = bert.encode_late_chunks(text, spans, max_length=32, batch_size=64)
    np.testing.assert_allclose(one, many, atol=1e-6)


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ([(10, 5)], r"spans\[0\] = \(10, 5\) is out of range: a span needs 0 <= start < end"),
        ([(0, 10_000)], r"out of range.*<= 187 \(the text's length"),
        ([(-1, 4)], r"spans\[0\] = \(-1, 4\) is out of range"),
        ([(20, 30), (0, 10)], r"spans\[1\] = \(0, 10\) starts before spans\[0\].*sort them"),
        ([], r"spans is empty: give at least one"),
        ([(0, 5, 7)], r"spans\[0\] has 3 values"),
        ([(3, 4)], r"spans\[0\] = \(3, 4\) holds no token's first character \(text 'l'\)"),
    ],
)
def test_bad_spans_are_refused(bert, spans, message):
    with pytest.raises(ValueError, match=message):
        bert.encode_late_chunks(TEXT, spans)


def test_bad_arguments_are_refused(bert):
    with pytest.raises(TypeError, match=r"spans must be a list of \(start, end\)"):
        bert.encode_late_chunks(TEXT, "0,10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"spans\[0\] start must be an int"):
        bert.encode_late_chunks(TEXT, [(0.0, 10)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"pooling 'cls' has one \[CLS\] state.*pooling='mean'"):
        bert.encode_late_chunks(TEXT, SPANS, pooling="cls")
    with pytest.raises(ValueError, match=r"overlap=30 is out of range.*a window holds 30"):
        bert.encode_late_chunks(TEXT, SPANS, max_length=32, overlap=30)
    with pytest.raises(ValueError, match=r"the text gives no tokens"):
        bert.encode_late_chunks("   ", [(0, 3)])
    with pytest.raises(ValueError, match=r"max_length=600 is out of range"):
        bert.encode_late_chunks(TEXT, SPANS, max_length=600)


@pytest.mark.parametrize("kind", ["roberta", "xlm-roberta"])
def test_a_family_model_with_its_own_specials_and_offsets(kind, tmp_path):
    """RoBERTa's byte-level BPE and XLM-RoBERTa's SentencePiece (<s> ... </s>, offsets of
    pieces that carry their space), short and in windows, against transformers."""
    import transformers
    from test_family_roberta import save_family

    folder = save_family(kind, tmp_path / kind, seed=4)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    bert = Bert.load(folder, threads=1)
    text = " ".join(
        ["the attention head looks at every token, hello world. a model and a layer"] * 3
    )
    # chunks that start at a word: SentencePiece's piece "▁hello" covers the space before it,
    # and belongs with its word (transformers' offsets start at the word)
    assert text[41] == "h" and text[40] == " " and text[121] == "w" and text[120] == " "
    spans = [(0, 41), (41, 121), (121, len(text))]
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    ids, offsets = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
    for max_length in (128, 24):
        width = max_length - 2
        starts, pick = _windows_oracle(len(ids), width, width // 2)
        states = torch.empty(len(ids), 32)
        with torch.no_grad():
            for w, s in enumerate(starts):
                window = [tok.cls_token_id, *ids[s : s + width], tok.sep_token_id]
                h = model(input_ids=torch.tensor([window])).last_hidden_state[0, 1:-1]
                for i in range(s, min(s + width, len(ids))):
                    if pick[i] == w:
                        states[i] = h[i - s]
        rows = []
        for a, b in spans:
            keep = [i for i, (s, _) in enumerate(offsets) if a <= s < b]
            rows.append(states[keep].mean(0))
        want = torch.stack(rows).numpy()
        got = bert.encode_late_chunks(text, spans, pooling="mean", max_length=max_length)
        np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match=r"pooling 'cls' has one \[CLS\] state"):
        bert.encode_late_chunks(text, spans, pooling="cls")  # refused, not guessed
