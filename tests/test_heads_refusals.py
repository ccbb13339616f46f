"""Sparse models that are not SPLADE, refused by name by every head class (issue 58): a CSR
folder (a ``SparseAutoEncoder`` over a dense model's pooled embedding) says "CSR", an
inference-free SPLADE folder (a ``Router`` / ``SparseStaticEmbedding``) says so, each in one
line naming the file and what loads it, whichever class was asked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertattn import CrossEncoder, MultiVectorEncoder, SparseEncoder
from bertattn.errors import ModelFolderError

_ST = "sentence_transformers."
FOLDERS = {
    "csr": [
        ("", f"{_ST}base.modules.transformer.Transformer"),
        ("1_Pooling", f"{_ST}sentence_transformer.modules.pooling.Pooling"),
        ("2_SAE", f"{_ST}sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder"),
    ],
    "router": [("", f"{_ST}base.modules.Router")],
    "static": [("", f"{_ST}sparse_encoder.modules.SparseStaticEmbedding")],
}  # fmt: skip
NAMED = {
    "csr": r"SparseAutoEncoder: CSR \(a SparseAutoEncoder over a dense model's pooled embedding\)",
    "router": r"Router: inference-free SPLADE \(a Router",
    "static": r"SparseStaticEmbedding: inference-free SPLADE \(SparseStaticEmbedding",
}


def sparse_folder(base: Path, out: Path, kind: str) -> Path:
    """``base``'s files with a ``modules.json`` of the ``kind`` of :data:`FOLDERS`."""
    shutil.copytree(base, out)
    for path, _ in FOLDERS[kind]:
        if path:
            (out / path).mkdir()
            (out / path / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    modules = [{"idx": i, "name": str(i), "path": p, "type": t}
               for i, (p, t) in enumerate(FOLDERS[kind])]  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules))
    return out


@pytest.mark.parametrize("kind", sorted(FOLDERS))
@pytest.mark.parametrize(
    ("cls", "who"),
    [(SparseEncoder, None), (CrossEncoder, "a CrossEncoder"),
     (MultiVectorEncoder, "a MultiVectorEncoder")],
)  # fmt: skip
def test_sparse_models_that_are_not_splade_are_refused_by_name(
    tiny_checkpoint, tmp_path, kind, cls, who
):  # type: ignore[no-untyped-def]
    folder = sparse_folder(tiny_checkpoint, tmp_path / kind, kind)
    with pytest.raises(ModelFolderError, match=NAMED[kind]) as err:
        cls(folder)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(folder / "modules.json"))
    assert msg.endswith("load it with sentence-transformers' SparseEncoder.")
    assert (f"{who} does not run it either" in msg) is (who is not None)
