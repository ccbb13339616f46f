"""MPNet checkpoints in the same encoder: random ``MPNetModel`` weights (seeded noise on every
parameter, the relative position bias table included) saved with ``save_pretrained``, with a
WordPiece tokenizer trained for the test by ``tokenizers`` in MPNet's form (``<s> A </s></s> B
</s>``; no real one is installable here). Hidden states within 1e-5 of transformers' on padded
batches of varied lengths, some past MPNet's 128-token bucket distance; every backend with the
bias against ``math``; ``Bert.encode`` equal to sentence-transformers on the same folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from family_helpers import (
    PAIRS,
    SENTENCES,
    TEXTS,
    assert_encode_equals_sentence_transformers,
    assert_reranker_equals_peers,
)
from tiny_bert import save_random

from bertattn import Bert, BertModel, explain
from bertattn.blocks.relative import packed_position_bias, position_bias, relative_position_bucket
from bertattn.errors import ModelFolderError
from bertattn.families import bert_layers as model_module

CORPUS = [
    *SENTENCES,
    "relative positions fall into buckets, near ones exactly and far ones on a log scale",
] * 20
TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=400,
)  # fmt: skip
BASE = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    max_position_embeddings=514,
)  # fmt: skip
SPECIALS = {
    "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
    "unk_token": "[UNK]", "pad_token": "<pad>", "mask_token": "<mask>",
}  # fmt: skip


def _wordpiece(folder: Path) -> int:
    """A lowercasing WordPiece vocabulary with MPNet's specials (``<s>`` 0, ``<pad>`` 1,
    ``</s>`` 2) and the post-processor transformers' MPNet converter writes."""
    from tokenizers import processors
    from tokenizers.implementations import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(
        unk_token="[UNK]", sep_token="</s>", cls_token="<s>", pad_token="<pad>",
        mask_token="<mask>", lowercase=True,
    )  # fmt: skip
    tok.train_from_iterator(
        CORPUS, vocab_size=120, special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0",
        pair="<s>:0 $A:0 </s>:0 </s>:0 $B:1 </s>:1",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab_size()


def save_mpnet(folder: Path, sizes: dict, seed: int = 0, cls: str = "MPNetModel") -> Path:
    """A random ``cls`` (MPNet, ``sizes``) and its tokenizer, saved as transformers saves it."""
    return _save_mpnet_model(folder, sizes, seed, cls)[0]


def _save_mpnet_model(folder: Path, sizes: dict, seed: int = 0, cls: str = "MPNetModel"):  # type: ignore[no-untyped-def]
    """:func:`save_mpnet`, and the transformers model it saved (in eval mode): a test that
    compares with it need not read its weights back."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _wordpiece(folder)
    config = transformers.AutoConfig.for_model("mpnet", vocab_size=vocab, **sizes)
    model = save_random(getattr(transformers, cls), config, folder, seed)
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "MPNetTokenizer",
                "do_lower_case": True,
                "model_max_length": sizes["max_position_embeddings"] - 2,
                **SPECIALS,
            }
        )  # fmt: skip
    )
    return folder, model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_mpnet(tmp_path_factory.mktemp("mpnet"), TINY)


def _long_batch(vocab: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Right-padded random ids (``<pad>`` = 1) of ``lengths``: ``(B, max)`` ids and mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.ones_like(ids)
    for i, n in enumerate(lengths):
        ids[i, n:], mask[i, n:] = 1, 0
        ids[i, 0], ids[i, n - 1] = 0, 2  # <s> ... </s>
    return ids, mask


def _max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max())


def test_buckets_are_transformers(tiny):
    """Every relative position from -600 to 600, the log buckets past 8 and the shared last
    bucket past 128 included."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    rel = torch.arange(-600, 601)[None, :]
    want = MPNetEncoder.relative_position_bucket(rel)
    got = relative_position_bucket(rel)
    assert torch.equal(got, want)
    # every bucket reached but 16: the upper half (keys after the query) starts at distance 1
    assert set(got.flatten().tolist()) == set(range(32)) - {16}


def test_hidden_states_equal_transformers(tiny):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    theirs = transformers.AutoModel.from_pretrained(tiny).eval()
    ours = BertModel.from_pretrained(tiny, backend="math")
    batches = [
        tok(TEXTS, padding=True, return_tensors="pt"),
        tok(TEXTS[:2], PAIRS, padding=True, return_tensors="pt"),
    ]
    ids, mask = _long_batch(theirs.config.vocab_size, [300, 170, 129, 9, 2])
    batches.append({"input_ids": ids, "attention_mask": mask})
    for batch in batches:
        with torch.no_grad():
            want = theirs(batch["input_ids"], attention_mask=batch["attention_mask"])
            got = ours(batch["input_ids"], batch["attention_mask"])
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(
            got.last_hidden_state[real], want.last_hidden_state[real], atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "varlen", "auto"])
def test_every_backend_carries_the_bias(tiny, backend):
    """Each backend the dispatcher can pick against ``math``, on lengths past 128 (the far
    buckets) with padding; and the bias matters (without it the outputs differ)."""
    ids, mask = _long_batch(120, [300, 170, 129, 9, 2], seed=1)
    ref = BertModel.from_pretrained(tiny, backend="math")
    model = BertModel.from_pretrained(tiny, backend=backend)
    model.chunk_workers = 1  # one forward on the whole batch: auto chooses on its 60% padding
    with torch.no_grad(), explain() as log:
        got = model(ids, mask).last_hidden_state
    with torch.no_grad():
        want = ref(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    ran = set(log.backends())
    assert ran == ({"varlen"} if backend in ("varlen", "auto") else {"sdpa"})  # auto: 60% pad
    if "varlen" in ran:
        assert all("relative position bias" in r.reason for r in log.records)
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.zero_()
        unbiased = model(ids, mask).last_hidden_state
    assert _max_error(unbiased[real], want[real]) > 1e-2


def test_the_bias_is_shared_and_computed_once(tiny):
    """One table in the encoder (not one per layer); the packed blocks are the padded bias's
    diagonal blocks, whatever holes the mask has (positions are padded indices)."""
    from bertattn.attention.padding import pack_padding_mask

    model = BertModel.from_pretrained(tiny)
    names = [n for n, _ in model.named_parameters() if "relative" in n]
    assert names == ["encoder.relative_attention_bias.weight"]
    table = model.encoder.relative_attention_bias.weight
    full = position_bias(table, 12)  # (1, H, 12, 12)
    mask = torch.tensor([[1] * 12, [1] * 5 + [0] * 7, [1, 0, 1, 1, 0, 1] + [0] * 6])
    blocks = packed_position_bias(table, pack_padding_mask(mask))
    for row, block in zip(mask, blocks, strict=True):
        keep = row.bool().nonzero().flatten()
        assert torch.equal(block, full[:, :, keep][:, :, :, keep])


def test_varlen_says_why_the_flash_kernel_is_left(tiny, monkeypatch):
    """Where torch's flash varlen kernel would run (CUDA, half precision) a biased call runs
    per sequence instead, and explain() says why; simulated on the CPU by making the kernel
    available (it must not be called)."""
    from bertattn.attention import backends

    def kernel(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("the flash varlen kernel takes no bias; it must not run")

    monkeypatch.setattr(backends, "cuda_varlen", lambda q: kernel)
    ids, mask = _long_batch(120, [40, 9], seed=2)
    model = BertModel.from_pretrained(tiny, backend="varlen")
    ref = BertModel.from_pretrained(tiny, backend="math")
    with torch.no_grad(), explain() as log:
        got = model(ids, mask).last_hidden_state
        want = ref(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    varlen = [r for r in log.records if r.backend == "varlen"]
    assert varlen and all(backends.VARLEN_BIAS_WHY in r.reason for r in varlen)


def test_a_packed_backend_without_bias_is_refused(tiny):
    from bertattn.attention import BACKENDS, BackendSpec, register_backend
    from bertattn.attention.backends import varlen_attention

    register_backend(
        BackendSpec("nobias", varlen_attention, returns_weights=False, layout="packed")
    )
    try:
        model = BertModel.from_pretrained(tiny, backend="nobias")
        ids, mask = _long_batch(120, [20, 9])
        with pytest.raises(ValueError, match="'nobias' takes no attention bias.*MPNet"):
            model(ids, mask)
    finally:
        del BACKENDS["nobias"]


def test_our_tokenizer_gives_transformers_ids(tiny):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    bert = Bert.load(tiny, threads=1)
    assert [e.ids for e in bert.tokenizer.encode_batch(TEXTS)] == tok(TEXTS)["input_ids"]
    ours = bert.tokenizer.encode_batch(TEXTS[:2], PAIRS)
    theirs = tok(TEXTS[:2], PAIRS)["input_ids"]
    assert [e.ids for e in ours] == theirs
    assert theirs[0][0] == 0 and theirs[0].count(2) == 3  # <s> A </s></s> B </s>
    assert bert.tokenizer.pad_token_id == 1


def test_encode_equals_sentence_transformers(tiny, tmp_path):
    assert_encode_equals_sentence_transformers(tiny, 32, TEXTS, tmp_path)


@pytest.mark.slow
def test_base_size_equals_transformers(tmp_path, mkl_products, monkeypatch):
    """768 wide, 12 layers, 12 heads (all-mpnet-base-v2's shape), random weights, one padded
    batch past 128 tokens. At this depth float32 rounding alone moves transformers' own output
    by ~7e-5 from float64, so: ``math`` within 1e-5 of transformers in float32 when it runs the
    same ops (its products through MKL as transformers' are, and the feed-forward's residual
    added after the product, not folded into it: the fold sums in another order, 1.4e-5 away on
    a Zen 4 EPYC, and is held to the baseline below like every backend), float64 runs equal to
    1e-10 (the
    math itself; the padded bias is one tensor for math and sdpa, so math and the packed path),
    and every backend no further from transformers' float64 output than twice transformers' own
    float32 error (the baseline)."""

    folder, theirs = _save_mpnet_model(tmp_path / "base", BASE, seed=3)  # the saved weights
    ids, mask = _long_batch(theirs.config.vocab_size, [136, 12], seed=3)
    real = mask.bool()
    with torch.no_grad():
        want = theirs(ids, attention_mask=mask).last_hidden_state[real]
        exact = theirs.double()(ids, attention_mask=mask).last_hidden_state[real]
    baseline = _max_error(want.double(), exact)
    assert 0 < baseline < 1e-3
    for backend in ("math", "sdpa", "varlen"):
        model = BertModel.from_pretrained(folder, backend=backend)
        with torch.no_grad():
            got = model(ids, mask).last_hidden_state[real]
            if backend != "sdpa":
                got64 = model.double()(ids, mask).last_hidden_state[real]
                assert _max_error(got64, exact) < 1e-10, backend
        assert _max_error(got.double(), exact) <= 2 * baseline, backend
    monkeypatch.setattr(model_module, "FOLD_RESIDUAL", False)
    model = BertModel.from_pretrained(folder, backend="math")
    with torch.no_grad():
        got = model(ids, mask).last_hidden_state[real]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_masked_lm_folder_loads_its_encoder(tmp_path):
    import transformers

    folder = save_mpnet(tmp_path / "mlm", TINY, cls="MPNetForMaskedLM")
    theirs = transformers.MPNetForMaskedLM.from_pretrained(folder).eval()
    with pytest.warns(UserWarning, match="skipped 5 task-head tensors"):
        model = BertModel.from_pretrained(folder)
    assert model.pooler is None
    ids, mask = _long_batch(120, [30, 4], seed=4)
    with torch.no_grad():
        want = theirs.mpnet(ids, attention_mask=mask).last_hidden_state
        got = model(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_what_is_not_equivalent_is_refused(tiny, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "relative_attention_num_buckets": 16}))
    with pytest.raises(ModelFolderError, match="relative_attention_num_buckets=16 is not supp"):
        Bert.load(folder)
    # a BERT config over MPNet's tensors: the bias table is named, not dropped
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ModelFolderError, match="unexpected keys"):
        BertModel.from_pretrained(folder)


def test_steps_show_the_relative_position_bias(tiny):
    """The article's steps on MPNet: the bias is its own step, the mask stays 0, and the
    steps' numbers give transformers' weights (softmax(scaled + position + mask))."""
    import transformers

    bert = Bert.load(tiny, threads=1)
    text = TEXTS[0]
    steps = bert.attention_steps(text, layer=1, head=2, query=3)
    ids = torch.tensor([bert.tokenizer.encode_batch([text])[0].ids])
    theirs = transformers.AutoModel.from_pretrained(tiny).eval()
    with torch.no_grad():
        want = theirs(ids, output_attentions=True).attentions[1][0, 2, 3]
        table = theirs.encoder.relative_attention_bias.weight.detach()
        pos = theirs.encoder.compute_position_bias(torch.zeros(1, ids.shape[1], 1))[0, 2, 3]
    assert steps.position_bias is not None
    torch.testing.assert_close(steps.position_bias, pos, atol=0, rtol=0)
    assert torch.equal(steps.bias, torch.zeros_like(steps.bias))  # no padding: the mask is 0
    recomputed = torch.softmax(steps.scaled + steps.position_bias + steps.bias, dim=-1)
    torch.testing.assert_close(recomputed, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(steps.weights, want, atol=1e-6, rtol=1e-5)
    assert float(table.abs().max()) > 0
    assert "+pos" in steps.table() and "position  = table[bucket(j - 3), head 2]" in steps.formula()
    assert "softmax(Q·Kᵀ / √d_k + position + mask)" in steps.formula()


def test_the_page_steps_view_is_refused_for_mpnet(tiny):
    bert = Bert.load(tiny, threads=1)
    with pytest.raises(ValueError, match="no step for MPNet's relative position bias"):
        bert.attention_maps(TEXTS[0], qkv_layers=[0])
    maps = bert.attention_maps(TEXTS[0])  # the head view itself is right: the math weights
    assert maps.layers[0].shape[-1] == len(maps.tokens)


def test_an_mpnet_classifier_is_a_cross_encoder(tiny, tmp_path):
    """``MPNetForSequenceClassification``: its head (dense + tanh on ``<s>``, then
    ``out_proj``) is RoBERTa's, so BERT's pooler and classifier; logits equal transformers'."""
    import transformers

    config = transformers.MPNetConfig.from_pretrained(tiny, num_labels=1)
    model = transformers.MPNetForSequenceClassification.from_pretrained(tiny, config=config)
    pairs = [(TEXTS[0], PAIRS[0]), (TEXTS[1], PAIRS[1]), (TEXTS[2], TEXTS[0])]
    assert_reranker_equals_peers(model, tiny, 5, pairs, tmp_path)


def test_an_mpnet_folder_without_tokenizer_json_is_refused(tiny, tmp_path):
    """vocab.txt alone would tokenize as BERT ([CLS] A [SEP]): refused, naming the file."""
    folder = tmp_path / "vocab-only"
    shutil.copytree(tiny, folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    (folder / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match="no tokenizer.json; bertattn reads an MPNet"):
        Bert.load(folder)
    BertModel.from_pretrained(folder)  # the encoder alone needs no tokenizer
