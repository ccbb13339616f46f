"""Checks the family tests share: a seeded padded batch, ``Bert.encode`` against
sentence-transformers on a folder of the family, and a reranker head of the family against
transformers and sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bertattn import Bert, CrossEncoder


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

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in getattr(model, head).parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    model.save_pretrained(tmp_path / "rr")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "rr" / name).write_bytes((source / name).read_bytes())
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
    from bertattn import BertModel

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
