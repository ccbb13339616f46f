"""ELECTRA discriminators in the same encoder: a random ``ElectraForPreTraining`` (tiny sizes,
embedding size = hidden size, seeded noise on every parameter) saved with ``save_pretrained``
loads its encoder strictly (the discriminator head skipped and reported), hidden states within
1e-5 of transformers'; an embedding projection (ELECTRA-small's) is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_bert import TINY, save_random

from bertattn import Bert
from bertattn.errors import ModelFolderError


def save_electra(base: Path, out: Path, seed: int = 0, **overrides: object) -> Path:
    import transformers

    sizes = {k: v for k, v in TINY.items()}
    config = transformers.ElectraConfig(
        **{"embedding_size": TINY["hidden_size"], **sizes, **overrides}
    )
    save_random(transformers.ElectraForPreTraining, config, out, seed, tokenizer_from=base)
    return out


def _pairs_equal_transformers(folder, theirs, bert):  # type: ignore[no-untyped-def]
    """``bert``'s hidden states on a padded batch of pairs within 1e-5 of ``theirs`` (an
    ``ElectraForPreTraining``) at the real tokens; bertattn's output."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(["the attention head looks at every token", "hello"], ["ok", "a word"],
                padding=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        want = theirs.electra(**batch).last_hidden_state
        got = bert.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got.last_hidden_state[real], want[real], atol=1e-5, rtol=1e-5)
    return got


def test_discriminator_encoder_equals_transformers(tiny_checkpoint, tmp_path):
    import transformers

    folder = save_electra(tiny_checkpoint, tmp_path / "electra")
    theirs = transformers.ElectraForPreTraining.from_pretrained(folder).eval()
    with pytest.warns(UserWarning, match="skipped 4 task-head tensors: discriminator_predictions"):
        bert = Bert.load(folder, threads=1)
    got = _pairs_equal_transformers(folder, theirs, bert)
    assert got.pooler_output is None  # ELECTRA has no pooler


@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_electra_small_embedding_projection_equals_transformers(tiny_checkpoint, tmp_path, backend):
    """ELECTRA-small's shape: 16-wide embedding tables, a linear projection to the 32-wide
    encoder (``embeddings_project``): hidden states within 1e-5 of transformers' on a padded
    batch of pairs, padded and packed backends alike; sentence-transformers' mean pooling too."""
    import transformers

    folder = save_electra(tiny_checkpoint, tmp_path / "small", embedding_size=16)
    theirs = transformers.ElectraForPreTraining.from_pretrained(folder).eval()
    assert theirs.electra.embeddings_project.weight.shape == (32, 16)
    with pytest.warns(UserWarning, match="skipped 4 task-head tensors"):
        bert = Bert.load(folder, threads=1, backend=backend)
    assert bert.model.embeddings.project is not None
    assert bert.model.embeddings.word.weight.shape[1] == 16
    _pairs_equal_transformers(folder, theirs, bert)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    texts = ["the attention head looks at every token", "hello", "a model and a layer"]
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = theirs.electra(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    mean = ((hidden * m).sum(1) / m.sum(1)).numpy()
    np.testing.assert_allclose(bert.encode(texts, pooling="mean", normalize=False), mean, atol=1e-5)


def test_a_wrong_projection_shape_is_named(tiny_checkpoint, tmp_path):
    folder = save_electra(tiny_checkpoint, tmp_path / "small", embedding_size=16)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "embedding_size": 24}))
    with pytest.raises(ModelFolderError, match="embeddings"):
        Bert.load(folder)
