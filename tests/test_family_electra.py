"""ELECTRA discriminators in the same encoder: a random ``ElectraForPreTraining`` (tiny sizes,
embedding size = hidden size, seeded noise on every parameter) saved with ``save_pretrained``
loads its encoder strictly (the discriminator head skipped and reported), hidden states within
1e-5 of transformers'; an embedding projection (ELECTRA-small's) is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_bert import TINY, save_random

from bertattn import Bert
from bertattn.errors import ModelFolderError


def save_electra(base: Path, out: Path, seed: int = 0, **overrides: object) -> Path:
    import transformers

    sizes = {k: v for k, v in TINY.items()}
    config = transformers.ElectraConfig(
        embedding_size=TINY["hidden_size"], **{**sizes, **overrides}
    )
    save_random(transformers.ElectraForPreTraining, config, out, seed, tokenizer_from=base)
    return out


def test_discriminator_encoder_equals_transformers(tiny_checkpoint, tmp_path):
    import transformers

    folder = save_electra(tiny_checkpoint, tmp_path / "electra")
    theirs = transformers.ElectraForPreTraining.from_pretrained(folder).eval()
    with pytest.warns(UserWarning, match="skipped 4 task-head tensors: discriminator_predictions"):
        bert = Bert.load(folder, threads=1)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tok(["the attention head looks at every token", "hello"], ["ok", "a word"],
                padding=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        want = theirs.electra(**batch).last_hidden_state
        got = bert.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got.last_hidden_state[real], want[real], atol=1e-5, rtol=1e-5)
    assert got.pooler_output is None  # ELECTRA has no pooler


def test_an_embedding_projection_is_refused(tiny_checkpoint, tmp_path):
    folder = save_electra(tiny_checkpoint, tmp_path / "small")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "embedding_size": 16}))
    with pytest.raises(ModelFolderError, match="embedding_size=16 differs from hidden_size=32"):
        Bert.load(folder)
