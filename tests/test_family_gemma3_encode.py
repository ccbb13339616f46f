"""EmbeddingGemma's sentence-transformers folder through ``Bert.load`` / ``encode``: a random
``Gemma3TextModel`` (the tiny odd size of test_family_gemma3, the tiny BERT's tokenizer) in
EmbeddingGemma's module chain, built and saved by sentence-transformers' own modules:
Transformer -> Pooling (mean) -> Dense (E -> 2E, no bias, identity) -> Dense (2E -> E) ->
Normalize, with the hub folder's prompts; against ``SentenceTransformer`` on the same folder,
with and without a prompt, through ``encode_query`` / ``encode_document`` and ``truncate_dim``.
Dense modules that do not chain, or that project tokens, are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_family_gemma3 import TINY
from tiny_bert import save_random

from bertattn import Bert
from bertattn.errors import ModelFolderError

#: prompts of google/embeddinggemma-300m's config_sentence_transformers.json (those a public
#: repository's test lists; the hub folder has more tasks)
PROMPTS = {
    "query": "task: search result | query: ",
    "document": "title: none | text: ",
    "Retrieval": "task: search result | query: ",
    "Retrieval-document": "title: none | text: ",
    "Reranking": "task: search result | query: ",
    "Classification": "task: classification | query: ",
    "Clustering": "task: clustering | query: ",
    "STS": "task: sentence similarity | query: ",
}
TEXTS = ["the attention head looks at every token", "hello", "a model and a layer, ok", "a b"]


@pytest.fixture(scope="module")
def gemma_st(tmp_path_factory, tiny_checkpoint) -> Path:
    """EmbeddingGemma's module chain around the random tiny Gemma, saved by
    sentence-transformers (seeded Dense weights)."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    base = tmp_path_factory.mktemp("gemma3_base")
    config = transformers.Gemma3TextConfig(**TINY)
    save_random(transformers.Gemma3TextModel, config, base, 11, tiny_checkpoint)
    width = TINY["hidden_size"]
    torch.manual_seed(5)
    identity = torch.nn.Identity()
    st = SentenceTransformer(
        modules=[
            Transformer(str(base)),
            Pooling(width, "mean"),
            Dense(width, 2 * width, bias=False, activation_function=identity),
            Dense(2 * width, width, bias=False, activation_function=identity),
            Normalize(),
        ],
        prompts=PROMPTS,
        device="cpu",
    )
    folder = tmp_path_factory.mktemp("gemma3_st")
    st.save(str(folder))
    return folder


def _assert_rows_equal(got: np.ndarray, want: np.ndarray) -> None:
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99999, cos
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_encode_equals_sentence_transformers(gemma_st: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gemma_st), device="cpu")
    bert = Bert.load(gemma_st, threads=1)
    assert len(bert.dense) == 2 and bert.pooling == "mean" and bert.normalize
    assert bert.prompts == PROMPTS and bert.get_embedding_dimension() == TINY["hidden_size"]
    for prompt_name in (None, "query", "document", "Clustering"):
        got = bert.encode(TEXTS, prompt_name=prompt_name)
        _assert_rows_equal(got, st.encode(TEXTS, prompt_name=prompt_name))
    _assert_rows_equal(bert.encode_query(TEXTS), st.encode_query(TEXTS))
    _assert_rows_equal(bert.encode_document(TEXTS), st.encode_document(TEXTS))
    # the Dense modules and the prompt matter: without them the rows are others
    plain = Bert.load(gemma_st, threads=1)
    plain.dense = ()
    assert np.abs(plain.encode(TEXTS) - bert.encode(TEXTS)).max() > 1e-3
    assert np.abs(bert.encode_query(TEXTS) - bert.encode(TEXTS)).max() > 1e-3


def test_truncate_dim_cuts_after_the_dense_modules(gemma_st: Path) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gemma_st), device="cpu", truncate_dim=16)
    want = st.encode(TEXTS, prompt_name="query")
    got = Bert.load(gemma_st, threads=1).encode(TEXTS, prompt_name="query", truncate_dim=16)
    assert got.shape == want.shape == (len(TEXTS), 16)
    _assert_rows_equal(got, want)


def _edit_dense(folder: Path, sub: str, **changes: object) -> None:
    path = folder / sub / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("sub", "changes", "message"),
    [
        ("3_Dense", {"in_features": 95}, r"3_Dense/config.json: in_features=95 but the module "
         r"before it gives 96 features; the Dense modules must chain: set in_features to 96"),
        ("2_Dense", {"in_features": 40}, r"2_Dense/config.json: in_features=40 but the module "
         r"before it gives 48 features"),
        ("2_Dense", {"module_input_name": "token_embeddings"}, r"module_input_name is "
         r"\"token_embeddings\"; a sentence-transformers Dense after Pooling projects the pooled "
         r"'sentence_embedding', not each token"),
        ("2_Dense", {"activation_function": "torch.nn.modules.activation.SiLU"},
         r"activation_function \"torch.nn.modules.activation.SiLU\" is not one bertattn runs"),
    ],
)  # fmt: skip
def test_bad_dense_modules_are_refused_by_name(
    gemma_st: Path, tmp_path: Path, sub: str, changes: dict, message: str
) -> None:
    folder = tmp_path / "st"
    shutil.copytree(gemma_st, folder)
    _edit_dense(folder, sub, **changes)
    with pytest.raises(ModelFolderError, match=message):
        Bert.load(folder, threads=1)


def test_a_dense_module_before_the_pooling_is_refused(gemma_st: Path, tmp_path: Path) -> None:
    folder = tmp_path / "st"
    shutil.copytree(gemma_st, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1], modules[2] = modules[2], modules[1]
    (folder / "modules.json").write_text(json.dumps(modules))
    message = r"entry 1: .*Dense before any .*Pooling; bertattn runs a Dense module on the pooled"
    with pytest.raises(ModelFolderError, match=message):
        Bert.load(folder, threads=1)


def test_a_folder_whose_dense_module_changes_the_width(gemma_st, tmp_path, cli) -> None:
    """Without ``3_Dense`` the rows are 2E wide: sentence-transformers, ``Bert.encode`` and the
    corpus job (its output file's width) agree."""
    from sentence_transformers import SentenceTransformer

    folder = tmp_path / "st"
    shutil.copytree(gemma_st, folder)
    modules = [m for m in json.loads((folder / "modules.json").read_text())
               if m["path"] != "3_Dense"]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    want = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    bert = Bert.load(folder, threads=1)
    assert want.shape == (len(TEXTS), 2 * TINY["hidden_size"]) == (len(TEXTS), bert.pooled_width)
    _assert_rows_equal(bert.encode(TEXTS), want)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    r = cli("encode", src, "-o", tmp_path / "out.npy", "--model", folder)
    assert r.code == 0, r
    _assert_rows_equal(np.load(tmp_path / "out.npy"), want)
    assert f"{len(TEXTS)} x {2 * TINY['hidden_size']} float32" in r.err, r
