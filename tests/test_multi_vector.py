"""``bertattn.MultiVectorEncoder`` against sentence-transformers 6's ``MultiVectorEncoder`` on
folders sentence-transformers itself builds and saves: the default model's encoder (and a tiny
XLM-RoBERTa) with a seeded Dense projection, a punctuation skip-list, prompts and per-task
lengths. Token rows within 1e-5, MaxSim scores within 1e-4, for queries and documents."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn import MultiVectorEncoder
from bertattn.errors import ModelFolderError

QUERIES = [
    "What is the capital of France?",
    "who wrote hamlet, and when did he write it? a long question that is cut at sixteen tokens",
    "attention",
]
DOCUMENTS = [
    "Paris is the capital of France.",
    "Berlin!",
    "Shakespeare wrote Hamlet around 1600; it is a tragedy. " * 8,  # cut at document_length
    "Attention weighs every token, then sums the values.",
]


def build(
    source: Path,
    out: Path,
    *,
    seed: int = 0,
    bias: bool = False,
    activation: torch.nn.Module | None = None,
    skiplist_tasks: list[str] | None = None,
    normalize: bool = True,
    width: int = 128,
    **kwargs: object,
) -> Path:
    """A MultiVectorEncoder folder saved by sentence-transformers: ``source``'s Transformer
    (query_length 16, document_length 64), a seeded Dense to ``width``, a punctuation
    skip-list, Normalize; ``kwargs`` go to ``MultiVectorEncoder`` (prompts, ...)."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    transformer = Transformer(str(source), query_length=16, document_length=64)
    hidden = transformer.get_embedding_dimension()
    dense = Dense(
        hidden,
        width,
        bias=bias,
        activation_function=activation or torch.nn.Identity(),
        module_input_name="token_embeddings",
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in dense.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    mask = MultiVectorMask(list(string.punctuation), skiplist_tasks=skiplist_tasks)
    modules = [transformer, dense, mask]
    if normalize:
        modules.append(Normalize(module_input_name="token_embeddings"))
    STMultiVectorEncoder(modules=modules, device="cpu", **kwargs).save(str(out))  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="module")
def folder(minilm_dir, tmp_path_factory) -> Path:
    return build(
        minilm_dir,
        tmp_path_factory.mktemp("mve") / "mve",
        prompts={"query": "query: ", "document": "passage: "},
    )


@pytest.fixture(scope="module")
def pair(folder):  # type: ignore[no-untyped-def]
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    return MultiVectorEncoder(folder, threads=1), STMultiVectorEncoder(str(folder), device="cpu")


def assert_rows_equal(got: list, want: list, atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert tuple(g.shape) == tuple(w.shape), (i, g.shape, w.shape)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, err_msg=f"item {i}")


def test_token_rows_and_maxsim_equal_sentence_transformers(pair, mkl_products):
    ours, st = pair
    q, d = ours.encode_query(QUERIES), ours.encode_document(DOCUMENTS)
    q_st, d_st = st.encode_query(QUERIES), st.encode_document(DOCUMENTS)
    assert_rows_equal(q, q_st)
    assert_rows_equal(d, d_st)
    assert all(isinstance(r, torch.Tensor) and r.dtype == torch.float32 for r in q + d)
    assert len(q[1]) == 16  # cut at query_length (prompt and specials included)
    assert len(d[2]) < 64  # cut at document_length, then its punctuation dropped
    scores = ours.similarity(q, d)
    assert scores.shape == (3, 4)
    torch.testing.assert_close(scores, st.similarity(q_st, d_st), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        ours.similarity_pairwise(q, d[:3]),
        st.similarity_pairwise(q_st, d_st[:3]),
        atol=1e-4,
        rtol=0,
    )
    # the best document of each query: a MaxSim that means something
    assert scores.argmax(1).tolist()[0] == 0


def test_maxsim_written_out(pair):
    """MaxSim itself, from its definition: sum over query tokens of the best document token."""
    ours, _ = pair
    q, d = ours.encode_query(QUERIES[:2]), ours.encode_document(DOCUMENTS[:2])
    want = torch.tensor([[float((qi @ dj.T).max(1).values.sum()) for dj in d] for qi in q])
    torch.testing.assert_close(ours.similarity(q, d), want, atol=1e-5, rtol=0)
    ours.similarity_fn_name = "meanmaxsim"
    try:
        lengths = torch.tensor([len(qi) for qi in q], dtype=torch.float32)[:, None]
        torch.testing.assert_close(ours.similarity(q, d), want / lengths, atol=1e-5, rtol=0)
    finally:
        ours.similarity_fn_name = "maxsim"


def test_prompts_truncate_dim_and_numpy(pair, mkl_products):
    ours, st = pair
    for kwargs in (
        {"prompt": "search: "},
        {"prompt_name": "document"},
        {"truncate_dim": 32},
        {"normalize_embeddings": True, "convert_to_numpy": True},
    ):
        got, want = ours.encode_query(QUERIES, **kwargs), st.encode_query(QUERIES, **kwargs)
        assert_rows_equal(got, want)
        got, want = (
            ours.encode_document(DOCUMENTS, **kwargs),
            st.encode_document(DOCUMENTS, **kwargs),
        )
        assert_rows_equal(got, want)
    assert ours.encode_query(QUERIES[0], truncate_dim=32).shape[1] == 32
    one = ours.encode_document(DOCUMENTS[1], convert_to_numpy=True)
    assert isinstance(one, np.ndarray) and one.ndim == 2
    # plain encode: no task, the skip-list as for documents, no prompt, no task length
    assert_rows_equal(ours.encode(DOCUMENTS), st.encode(DOCUMENTS))


def test_skiplist_drops_punctuation_rows_of_documents_only(pair):
    ours, _ = pair
    text = "Berlin, Paris!"
    # [CLS] passage : berlin , paris ! [SEP]: ':' ',' '!' skipped in a document
    assert len(ours.encode_document(text)) == 5
    # a query keeps every token: [CLS] query : berlin , paris ! [SEP]
    assert len(ours.encode_query(text)) == 8


def test_batch_independence(pair):
    ours, _ = pair
    batch = ours.encode_document(DOCUMENTS, batch_size=32)
    for i, text in enumerate(DOCUMENTS):
        alone = ours.encode_document([text])[0]
        torch.testing.assert_close(batch[i], alone, atol=1e-6, rtol=0)
    small = ours.encode_document(DOCUMENTS, batch_size=1)
    assert_rows_equal(small, batch, atol=1e-6)
    # a neighbour's length does not change a query's rows
    mixed = ours.encode_query([QUERIES[2], QUERIES[1]])
    torch.testing.assert_close(mixed[0], ours.encode_query(QUERIES[2]), atol=1e-6, rtol=0)


def test_rows_are_views_of_one_packed_tensor(pair):
    ours, _ = pair
    rows = ours.encode_document(DOCUMENTS[:2])
    base = rows[0].untyped_storage().data_ptr()
    assert rows[1].untyped_storage().data_ptr() == base  # no per-text (nor padded) copy


def test_bias_tanh_and_skiplist_on_both_tasks(minilm_dir, tmp_path, mkl_products):
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    folder = build(
        minilm_dir,
        tmp_path / "m",
        seed=3,
        bias=True,
        activation=torch.nn.Tanh(),
        skiplist_tasks=["query", "document"],
        normalize=False,
        width=96,
        similarity_fn_name="meanmaxsim",
        truncate_dim=48,
    )
    ours, st = (
        MultiVectorEncoder(folder, threads=1),
        STMultiVectorEncoder(str(folder), device="cpu"),
    )
    assert ours.similarity_fn_name == "meanmaxsim" and ours.get_embedding_dimension() == 48
    q, d = ours.encode_query(QUERIES), ours.encode_document(DOCUMENTS)
    q_st, d_st = st.encode_query(QUERIES), st.encode_document(DOCUMENTS)
    assert_rows_equal(q, q_st)
    assert_rows_equal(d, d_st)
    torch.testing.assert_close(ours.similarity(q, d), st.similarity(q_st, d_st), atol=1e-4, rtol=0)


def test_a_family_model(tmp_path):
    """An XLM-RoBERTa encoder (random weights, SentencePiece vocabulary) under the projection."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder
    from test_family_roberta import save_family

    base = save_family("xlm-roberta", tmp_path / "xlmr")
    folder = build(base, tmp_path / "m", seed=5, width=16)
    ours, st = (
        MultiVectorEncoder(folder, threads=1),
        STMultiVectorEncoder(str(folder), device="cpu"),
    )
    texts = ["the attention head looks at every token", "hello, world.", "a model and a layer"]
    assert_rows_equal(ours.encode_query(texts), st.encode_query(texts))
    d, d_st = ours.encode_document(texts), st.encode_document(texts)
    assert_rows_equal(d, d_st)
    torch.testing.assert_close(ours.similarity(d, d), st.similarity(d_st, d_st), atol=1e-4, rtol=0)


# ---------------------------------------------------------------------- refusals
def _edited(folder: Path, tmp_path: Path, name: str, edit) -> Path:  # type: ignore[no-untyped-def]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / name
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        (
            "sentence_bert_config.json",
            lambda c: c.update(query_expansion={"strategy": "sliding", "length": 32}),
            r"query_expansion strategy \"sliding\" / attend false: expected strategy 'fixed'",
        ),
        (
            "modules.json",
            lambda m: m.insert(
                2,
                {
                    "idx": 9,
                    "name": "9",
                    "path": "",
                    "type": "sentence_transformers.multi_vector_encoder.modules.token_pooling."
                    "HierarchicalTokenPooling",
                },
            ),
            r"entry 2: module type .*HierarchicalTokenPooling.* token pooling, routers and "
            r"custom modules are not supported",
        ),
        (
            "config_sentence_transformers.json",
            lambda c: c.update(model_type="SparseEncoder"),
            r"model_type is \"SparseEncoder\"; bertattn.MultiVectorEncoder loads",
        ),
        (
            "config_sentence_transformers.json",
            lambda c: c.update(similarity_fn_name="cosine"),
            r"similarity_fn_name \"cosine\"; a multi-vector model scores with one of",
        ),
        (
            "1_Dense/config.json",
            lambda c: c.update(activation_function="my.module.Swish"),
            r"activation_function \"my.module.Swish\" is not one bertattn runs",
        ),
        (
            "1_Dense/config.json",
            lambda c: c.update(module_input_name="sentence_embedding"),
            r"module_input_name is \"sentence_embedding\"; a multi-vector Dense projects",
        ),
    ],
)
def test_folders_it_does_not_run_are_refused_by_name(folder, tmp_path, name, edit, message):
    with pytest.raises(ModelFolderError, match=message):
        MultiVectorEncoder(_edited(folder, tmp_path, name, edit))


def test_query_expansion_of_the_transformer_equals_sentence_transformers(folder, tmp_path):
    """sentence_bert_config.json's query_expansion ("min": queries shorter than 12 tokens
    padded with [MASK] to 12, longer ones kept up to query_length 16, unattended)."""
    from sentence_transformers import MultiVectorEncoder as STMultiVectorEncoder

    expansion = {"strategy": "min", "attend": False, "length": 12}
    copy = _edited(folder, tmp_path, "sentence_bert_config.json",
                   lambda c: c.update(query_expansion=expansion))  # fmt: skip
    ours, st = MultiVectorEncoder(copy, threads=1), STMultiVectorEncoder(str(copy), device="cpu")
    q = ours.encode_query(QUERIES)
    assert_rows_equal(q, st.encode_query(QUERIES))
    assert [len(r) for r in q] == [12, 16, 12]
    assert_rows_equal(ours.encode_document(DOCUMENTS), st.encode_document(DOCUMENTS))


def test_a_plain_folder_is_refused(minilm_dir, tiny_checkpoint):
    # a SentenceTransformer folder (Pooling, Normalize): sentence-transformers would add a
    # random projection
    with pytest.raises(ModelFolderError, match=r"a SentenceTransformer folder without a Dense"):
        MultiVectorEncoder(minilm_dir)
    with pytest.raises(ModelFolderError, match=r"no modules.json; a MultiVectorEncoder folder"):
        MultiVectorEncoder(tiny_checkpoint)


def test_bad_arguments_are_refused(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match=r"output_value=None is not supported"):
        ours.encode_query(QUERIES, output_value=None)
    with pytest.raises(ValueError, match=r"has no `convert_to_tensor`"):
        ours.encode_document(DOCUMENTS, convert_to_tensor=True)
    with pytest.raises(ValueError, match=r"token_pooling= is not supported"):
        ours.encode_document(DOCUMENTS, token_pooling=object())
    with pytest.raises(ValueError, match=r"keyword argument\(s\) it does not take: colour"):
        ours.encode_document(DOCUMENTS, colour="red")
    with pytest.raises(ValueError, match=r"Prompt name 'nope' not found .* keys \['query'"):
        ours.encode_query(QUERIES, prompt_name="nope")
    with pytest.raises(ValueError, match=r"task must be one of \('query', 'document'\)"):
        ours.encode(QUERIES, task="passage")
    with pytest.raises(ValueError, match=r"similarity_fn_name 'cosine' is not supported"):
        ours.similarity_fn_name = "cosine"
    with pytest.raises(TypeError, match=r"embeddings1 must be a list of \(tokens, dim\)"):
        ours.similarity("q", [])
    with pytest.raises(ValueError, match=r"different widths \[32, 128\]"):
        ours.similarity(
            ours.encode_query(QUERIES, truncate_dim=32), ours.encode_document(DOCUMENTS)
        )
    with pytest.raises(TypeError, match=r"batch_size must be an int >= 1"):
        ours.encode_query(QUERIES, batch_size="8")
