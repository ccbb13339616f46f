"""Checks the family tests share: a seeded padded batch, ``Bert.encode`` against
sentence-transformers on a folder of the family, a reranker head of the family against
transformers and sentence-transformers, hidden states against transformers' (a padded batch,
or each text alone), the explain text of a forward, and a bad ``config.json`` refused by
name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import Bert, BertModel, CrossEncoder
from bertattn.attention import dispatch
from bertattn.errors import ModelFolderError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SENTENCES = [
    "the attention head looks at every token in the sentence",
    "hello world, a model and a layer",
    "queries, keys and values: softmax over the scaled dot products",
]  # the start of a corpus a family's test trains its tokenizer on
TEXTS = ["the attention head looks at every token", "hello", "a model and a layer, ok"]
PAIRS = ["every token", "the sentence and a word"]  # second texts of TEXTS[:2]


def padded_batch(
    lengths: list[int], *, left: bool = False, seed: int = 1, vocab: int = 99
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ids in ``[5, vocab)`` ``(B, L)`` and their attention mask ``(B, L)`` for texts of
    ``lengths`` tokens, padded (id 0) on the right, or on the left when ``left``."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(5, vocab, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        if left:
            mask[i, n - length :] = 1
        else:
            mask[i, :length] = 1
    return ids.masked_fill(mask == 0, 0), mask


def assert_encode_equals_sentence_transformers(
    folder: Path, width: int, texts: list[str], tmp_path: Path
) -> None:
    """A sentence-transformers folder (the family's ``folder`` + mean pooling over ``width``):
    bertattn's rows within 1e-5 of sentence-transformers', cosine >= 0.99999."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    st = SentenceTransformer(
        modules=[Transformer(str(folder)), Pooling(width, "mean")], device="cpu"
    )
    st.save(str(tmp_path / "st"))
    want = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    got = Bert.load(tmp_path / "st", threads=1).encode(texts)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-5)


def save_with_seeded_head(
    model: torch.nn.Module,
    folder: Path,
    seed: int,
    tokenizer_from: Path | None = None,
    names: tuple[str, ...] = TOKENIZER_FILES,
    head: str = "classifier",
) -> Path:
    """``model``'s layer ``head`` set to seeded N(0, 1) weights (a head that decides something),
    the model saved to ``folder`` with ``save_pretrained`` and the tokenizer files ``names`` of
    ``tokenizer_from`` (when given) copied beside it; returns ``folder``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in getattr(model, head).parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    for name in names if tokenizer_from is not None else ():
        (folder / name).write_bytes((tokenizer_from / name).read_bytes())
    return folder


def assert_tagger_equals_pipeline(
    folder: Path, texts: list[str], keys: tuple[str, ...] = ("entity",)
) -> None:
    """bertattn's token-classification pipeline on the tagger ``folder``: more than two
    entities over ``texts``, each entity's ``keys`` equal to transformers' pipeline's and its
    score within 1e-5."""
    import transformers

    import bertattn

    theirs = transformers.pipeline("token-classification", model=str(folder))
    ours = bertattn.pipeline("token-classification", folder)
    got, want = ours(texts), theirs(texts)
    assert sum(map(len, got)) > 2
    for g_row, w_row in zip(got, want, strict=True):
        assert [[e[k] for k in keys] for e in g_row] == [[e[k] for k in keys] for e in w_row]
        np.testing.assert_allclose([e["score"] for e in g_row], [e["score"] for e in w_row],
                                   atol=1e-5)  # fmt: skip


def assert_reranker_equals_peers(
    model: torch.nn.Module,
    source: Path,
    seed: int,
    pairs: list[tuple[str, str]],
    tmp_path: Path,
    head: str = "classifier",
) -> None:
    """``model`` (a ``*ForSequenceClassification`` of one label) with a seeded classifier (its
    layer called ``head``: Qwen3's is ``score``), saved with ``source``'s tokenizer:
    ``CrossEncoder`` logits within 1e-5 of transformers' and scores within 1e-5 of
    sentence-transformers'."""
    import transformers
    from sentence_transformers import CrossEncoder as STCrossEncoder

    save_with_seeded_head(model, tmp_path / "rr", seed, source, head=head)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "rr")
    batch = tok([p[0] for p in pairs], [p[1] for p in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model.eval()(**batch).logits
    ce = CrossEncoder(tmp_path / "rr", threads=1)
    torch.testing.assert_close(ce.logits(pairs), want, atol=1e-5, rtol=1e-5)
    st = STCrossEncoder(str(tmp_path / "rr"), device="cpu")
    np.testing.assert_allclose(ce.predict(pairs), st.predict(pairs), atol=1e-5)


def states(folder: Path, backend: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """bertattn's last hidden states ``(B, L, E)`` of ``folder`` on ``backend``."""
    model = BertModel.from_pretrained(folder, backend=backend)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


def assert_states_equal(folder: Path, hf: torch.nn.Module, backend: str, ids, mask) -> None:  # type: ignore[no-untyped-def]
    """bertattn's hidden states of ``folder`` within 1e-5 of transformers' ``hf`` on the real
    tokens of the batch."""
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    got = states(folder, backend, ids, mask)
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def assert_each_text_alone_equal(folder: Path, hf: torch.nn.Module, backend: str) -> None:
    """Texts of mixed lengths (23, 1, 40 and 7 tokens) in one batch: each text's states of
    ``folder`` on ``backend`` within 1e-5 of transformers' ``hf`` on that text alone, with no
    padding at all."""
    lengths = [23, 1, 40, 7]
    ids, mask = padded_batch(lengths, seed=4)
    got = states(folder, backend, ids, mask)
    with torch.no_grad():
        for row, n in enumerate(lengths):
            want = hf(input_ids=ids[row : row + 1, :n]).last_hidden_state[0]
            torch.testing.assert_close(got[row, :n], want, atol=1e-5, rtol=1e-5)


def explain_varlen(folder: Path, lengths: list[int], vocab: int = 99) -> str:
    """The explain text of one ``varlen`` forward of ``folder`` on a padded batch of
    ``lengths``."""
    ids, mask = padded_batch(lengths, vocab=vocab)
    with torch.no_grad(), dispatch.explain() as ex:
        states(folder, "varlen", ids, mask)
    return str(ex)


def assert_config_refused(folder: Path, config: dict, message: str) -> None:
    """``config`` written as ``folder``'s config.json: ``BertModel.from_pretrained`` refuses
    the folder with a ``ModelFolderError`` matching ``message``."""
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match=message):
        BertModel.from_pretrained(folder)


def copy_with_config(src: Path, dst: Path, **changes: object) -> Path:
    """A copy of the model folder ``src`` at ``dst`` with ``changes`` made to its
    config.json; returns ``dst``."""
    shutil.copytree(src, dst)
    data = json.loads((dst / "config.json").read_text())
    data.update(changes)
    (dst / "config.json").write_text(json.dumps(data))
    return dst
