"""A large CPU batch runs in row chunks (bertattn.encoder.chunks): the same outputs as
transformers on the whole batch, and chunked only where it may be."""

from __future__ import annotations

import pytest
import torch
import transformers

import bertattn
from bertattn import BertModel
from bertattn.encoder.chunks import chunk_tokens, row_chunks


def test_chunk_tokens_by_width():
    assert chunk_tokens(384, 1536) == 1024  # MiniLM: 1024 x 1536 x 4 B = 6 MiB <= 8 MiB
    assert chunk_tokens(384, 1536, 2) == 2048  # in bfloat16
    assert chunk_tokens(768, 3072) == 512  # BERT-base
    assert chunk_tokens(1024, 4096) == 512
    assert chunk_tokens(8192, 32768) == 256  # never below 256


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([5, 5, 5], 100, [(0, 3)]),
        ([5, 5, 5], 10, [(0, 2), (2, 3)]),
        ([5, 5, 5], 9, [(0, 1), (1, 2), (2, 3)]),
        ([20, 3, 3], 10, [(0, 1), (1, 3)]),  # a row over the budget is a chunk of its own
        ([3, 20, 3], 10, [(0, 1), (1, 2), (2, 3)]),
        ([], 10, []),
    ],
)
def test_row_chunks(lengths, budget, expected):
    assert row_chunks(lengths, budget) == expected


def _batch(rows: int = 7, length: int = 12):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 99, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for i in range(rows):
        mask[i, length - 2 * i % length :] = 0 if i % 2 else 1  # every other row padded
    mask[:, 0] = 1
    ids[mask == 0] = 0
    types = (torch.rand(rows, length, generator=g) > 0.5).long() * mask
    return ids, mask, types


class _Spy:
    """Counts BertModel._run calls (one per chunk) on one model."""

    def __init__(self, model: BertModel) -> None:
        self.calls: list[int] = []
        run = model._run

        def counted(*args, **kwargs):
            self.calls.append(args[7][0])  # the chunk's rows
            return run(*args, **kwargs)

        model._run = counted  # type: ignore[method-assign]


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "varlen"])
def test_chunked_forward_matches_transformers(tiny_checkpoint, backend):
    hf = transformers.BertModel.from_pretrained(tiny_checkpoint, attn_implementation="eager")
    model = BertModel.from_pretrained(tiny_checkpoint, backend=backend).eval()
    model.chunk_tokens = 30  # 7 rows of up to 12 tokens: several chunks
    spy = _Spy(model)
    ids, mask, types = _batch()
    weights = backend in ("auto", "math")
    with torch.inference_mode():
        ref = hf.eval()(ids, mask, types, output_attentions=True, output_hidden_states=True)
        out = model(
            ids, mask, types, output_attentions=[1] if weights else False, output_hidden_states=True
        )
    assert len(spy.calls) > 2 and sum(spy.calls) == 7
    real = mask.bool()
    torch.testing.assert_close(
        out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=0)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3
    for ours, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=0)
    if weights:
        assert out.attentions[0] is None and out.attentions[1].shape == (7, 4, 12, 12)
        torch.testing.assert_close(out.attentions[1], ref.attentions[1], atol=1e-5, rtol=0)
    else:
        assert out.attentions is None


def test_tuple_output_and_embeds(tiny_checkpoint):
    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    ids, mask, _ = _batch()
    with torch.inference_mode():
        whole = model(ids, mask, return_dict=False)
        embeds = model.embeddings.word(ids)
        model.chunk_tokens = 25
        spy = _Spy(model)
        parts = model(ids, mask, return_dict=False)
        by_embeds = model(inputs_embeds=embeds, attention_mask=mask)
    assert len(spy.calls) > 2
    assert isinstance(parts, tuple) and len(parts) == len(whole) == 2
    real = mask.bool()
    torch.testing.assert_close(parts[0][real], whole[0][real], atol=1e-5, rtol=0)
    torch.testing.assert_close(by_embeds.last_hidden_state[real], whole[0][real], atol=1e-5, rtol=0)


def test_not_chunked_where_it_may_not_be(tiny_checkpoint):
    """One call for the whole batch: with autograd (a chunked graph is another graph), in
    training mode (dropout's random stream), when the budget is 0, and when the batch fits."""
    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    ids, mask, _ = _batch()
    spy = _Spy(model)
    model.chunk_tokens = 25
    model(ids, mask)  # autograd on
    model.train()
    with torch.no_grad():
        model(ids, mask)
    model.eval()
    with torch.no_grad():
        model.chunk_tokens = 0
        model(ids, mask)
        model.chunk_tokens = ids.numel()
        model(ids, mask)
        model.chunk_tokens = None  # the model's own budget: 256 tokens at least
        model(ids, mask)
        model.chunk_tokens = 25
        model(ids, mask)  # and chunked again: the spy sees it
    assert spy.calls[:5] == [7] * 5 and len(spy.calls) > 6


def test_bert_encode_on_long_batches_is_chunked(tiny_checkpoint):
    """Bert.encode on a batch above the budget gives what it gives batch by batch."""
    bert = bertattn.Bert.load(tiny_checkpoint)
    texts = [" ".join(["word"] * (5 + 3 * i)) for i in range(12)]
    bert.model.chunk_tokens = 0
    whole = bert.encode(texts, batch_size=64)
    bert.model.chunk_tokens = 40
    spy = _Spy(bert.model)
    chunked = bert.encode(texts, batch_size=64)
    assert len(spy.calls) > 3
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)


def test_chunk_tokens_is_checked_and_survives_copies(tiny_checkpoint):
    import copy
    import pickle

    model = BertModel.from_pretrained(tiny_checkpoint).eval()
    assert model.chunk_tokens is None and model.chunk_budget == 16384  # TINY's widths
    for bad, kind in (("1024", TypeError), (1.5, TypeError), (-1, ValueError), (True, TypeError)):
        with pytest.raises(kind, match="chunk_tokens"):
            model.chunk_tokens = bad
    assert model.chunk_tokens is None  # a refused value changes nothing
    model.chunk_tokens = 30
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.chunk_tokens == 30 and clone.chunk_budget == 30
        spy = _Spy(clone)
        ids, mask, _ = _batch()
        with torch.inference_mode():
            clone(ids, mask)
        assert len(spy.calls) > 2
