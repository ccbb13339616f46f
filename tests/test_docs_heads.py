"""The Python examples of docs/heads.md print what their comments say, with the hub names they
use (which cannot be downloaded here) replaced by local folders of the same architecture (the
stand-ins of ``test_docs_blocks.py``, which runs every block of every page)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_docs_blocks import hub_stand_ins, localize_python, parse  # noqa: F401  (fixture)
from test_heads_pipelines import sentiment, tagger  # noqa: F401  (fixtures)

DOC = Path(__file__).resolve().parents[1] / "docs" / "heads.md"


def python_blocks() -> list[str]:
    return [b.code for b in parse(DOC) if b.lang == "python"]


def test_the_doc_has_examples():
    assert len(python_blocks()) >= 3


@pytest.mark.filterwarnings("ignore:.* were truncated")
def test_python_examples_run(hub_stand_ins, capsys):  # noqa: F811
    for code in python_blocks():
        exec(compile(localize_python(code, hub_stand_ins), str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "(2,)" in out and "torch.Size([2, 30522]) True" in out
    assert "['corpus_id', 'score', 'text']" in out and "['active_dims', 'sparsity_ratio']" in out
