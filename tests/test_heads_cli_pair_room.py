"""``bertattn rerank --max-length`` too small for a query-document pair (the hostile round's
``--max-length 3``: every pair cut to its special tokens, every document scored the same, exit
0) is refused in one line with the minimum: 5 for BERT's ``[CLS] q [SEP] d [SEP]`` before the
model loads, and the model's own pair template plus two once it is loaded (a tokenizer that
adds 4 special tokens to a pair needs 6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import test_heads_cross_encoder
from test_heads_cli import DOCS, QUERY, _error

reranker = test_heads_cross_encoder.reranker


@pytest.fixture
def docs_file(tmp_path) -> Path:
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def four_specials(reranker, tmp_path_factory) -> Path:
    """The reranker with RoBERTa's pair template: ``[CLS] a [SEP] [SEP] b [SEP]``."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    folder = tmp_path_factory.mktemp("four") / "reranker"
    shutil.copytree(reranker, folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(folder / "tokenizer.json"))
    assert tok.num_special_tokens_to_add(True) == 4
    return folder


@pytest.mark.parametrize("length", ["3", "4"])
def test_a_max_length_below_a_pair_is_refused_before_the_model_loads(
    cli, reranker, docs_file, tmp_path, length
):
    out = tmp_path / "out.jsonl"
    r = cli("rerank", QUERY, "-i", docs_file, "--model", reranker, "--max-length", length,
            "-o", out)  # fmt: skip
    _error(r, 2, f"--max-length must be an integer >= 5, got {length} ([CLS], [SEP], [SEP] and "
                 f"at least one token of the query and of the document).")  # fmt: skip
    assert not out.exists()


def _scores(r) -> list[float]:  # type: ignore[no-untyped-def]
    return [json.loads(line)["score"] for line in r.out.splitlines()]


def test_the_least_max_length_tells_the_documents_apart(cli, reranker, docs_file):
    r = cli("rerank", QUERY, "-i", docs_file, "--model", reranker, "--max-length", "5", "-q")
    assert r.code == 0, r
    assert len(set(_scores(r))) == len(DOCS), r.out  # a token of each document: 5 scores


def test_a_tokenizer_with_more_pair_specials_needs_more(cli, four_specials, docs_file, tmp_path):
    out = tmp_path / "out.jsonl"
    r = cli("rerank", QUERY, "-i", docs_file, "--model", four_specials, "--max-length", "5",
            "-o", out)  # fmt: skip
    _error(r, 2, "--max-length 5 cannot hold a query-document pair for this model: its "
                 "tokenizer adds 4 special tokens to a pair, and the query and the document "
                 "need a token each; use --max-length 6 or more.")  # fmt: skip
    assert not out.exists()
    r = cli("rerank", QUERY, "-i", docs_file, "--model", four_specials, "--max-length", "6", "-q")
    assert r.code == 0, r
    assert len(set(_scores(r))) == len(DOCS), r.out
