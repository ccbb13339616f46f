"""DeBERTa-v2/v3 in bertattn's own encoder: random ``DebertaV2Model`` folders saved by
transformers (a tiny odd size: 3 heads of 10 in a 30-wide model, 8 position buckets, and
DeBERTa-v3-base's shape cut to 2 layers), against transformers' native class on padded batches
(right and left padding) and packed mixed lengths, on every backend; v2's variants (own
position projections, one term, absolute positions, token types, a narrow embedding); the
tokenizer transformers saves; every refusal by name."""

from __future__ import annotations

from pathlib import Path

import family_helpers as fam
import pytest
import torch
from tiny_bert import save_random

from bertattn import BertModel
from bertattn.attention import BACKENDS, BackendSpec, register_backend
from bertattn.attention.backends import math_attention
from bertattn.encoder import BertTokenizer, resolve_model
from bertattn.errors import ModelFolderError

#: DeBERTa-v3's choices (pos_att_type, buckets, shared keys, normed table, no absolute
#: positions, no token types) at a tiny odd size
SIZES = dict(
    vocab_size=99, hidden_size=30, num_hidden_layers=3, num_attention_heads=3,
    intermediate_size=37, max_position_embeddings=64, relative_attention=True,
    position_buckets=8, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
    norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
    type_vocab_size=0, pad_token_id=0, layer_norm_eps=1e-7,
)  # fmt: skip
#: microsoft/deberta-v3-base's config.json (the hub folder's values), cut to 2 of its 12 layers
V3_BASE = dict(
    vocab_size=128100, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
    intermediate_size=3072, hidden_act="gelu", max_position_embeddings=512,
    relative_attention=True, position_buckets=256, max_relative_positions=-1,
    pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
    position_biased_input=False, type_vocab_size=0, pad_token_id=0, layer_norm_eps=1e-7,
    pooler_hidden_size=768, pooler_hidden_act="gelu", pooler_dropout=0,
)  # fmt: skip
BACKENDS_TAKING_IT = ("auto", "math", "sdpa", "varlen")
#: a sentencepiece vocabulary for the tokenizer tests (pieces, scores by rank)
PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁the", "▁attention", "▁head", "▁looks",
          "▁at", "▁every", "▁token", "▁hello", "▁a", "▁model", "▁and", "▁layer", ",", "▁ok",
          *"setharolnidmkycvgp", "▁"]  # fmt: skip


def save_tokenizer(folder: Path) -> None:
    """A DeBERTa-v3 tokenizer (``DebertaV2Tokenizer`` on :data:`PIECES`) saved by transformers
    into ``folder``: ``tokenizer.json`` and ``tokenizer_config.json``."""
    from transformers import DebertaV2Tokenizer

    vocab = [(piece, -float(rank)) for rank, piece in enumerate(PIECES)]
    DebertaV2Tokenizer(vocab=vocab).save_pretrained(folder)


def _save(folder: Path, seed: int = 0, cls_name: str = "DebertaV2Model",
          **overrides: object) -> torch.nn.Module:  # fmt: skip
    import transformers

    config = transformers.DebertaV2Config(**{**SIZES, **overrides})
    return save_random(getattr(transformers, cls_name), config, folder, seed)


@pytest.fixture(scope="module")
def deberta(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("deberta")
    hf = _save(folder)
    save_tokenizer(folder)
    return folder, hf


@pytest.mark.parametrize("backend", BACKENDS_TAKING_IT)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_hidden_states_equal_transformers(deberta, backend: str, left: bool) -> None:
    """Lengths past the 4 exact buckets (log buckets up to 64) and past the table's span."""
    fam.assert_states_equal(*deberta, backend, *fam.padded_batch([37, 12, 25, 3], left=left))


@pytest.mark.parametrize("backend", BACKENDS_TAKING_IT)
def test_mixed_lengths_equal_transformers_one_text_at_a_time(deberta, backend: str) -> None:
    """Texts of mixed lengths in one batch (packed by ``varlen`` and by ``auto`` on the CPU,
    padded by ``math`` and ``sdpa``), each text's states against transformers on that text
    alone, with no padding at all."""
    folder, hf = deberta
    fam.assert_each_text_alone_equal(folder, hf, backend)


@pytest.mark.parametrize(
    "variant",
    [
        dict(share_att_key=False),
        dict(share_att_key=False, pos_att_type="c2p", position_buckets=-1,
             max_relative_positions=16),
        dict(pos_att_type="p2c|c2p", norm_rel_ebd="none"),
        dict(position_biased_input=True, type_vocab_size=2, embedding_size=20),
    ],
    ids=["own-projections", "c2p-only-no-buckets", "v2-string-no-norm", "absolute-types-narrow"],
)  # fmt: skip
def test_v2_variants_equal_transformers(tmp_path: Path, variant: dict) -> None:
    hf = _save(tmp_path, seed=3, **variant)
    ids, mask = fam.padded_batch([33, 9, 20], seed=2)
    types = torch.zeros_like(ids)
    types[:, 5:] = 1 if variant.get("type_vocab_size") else 0
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    keep = mask.bool()
    for backend in ("math", "varlen"):
        model = BertModel.from_pretrained(tmp_path, backend=backend)
        with torch.no_grad():
            got = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        torch.testing.assert_close(got.last_hidden_state[keep], want[keep], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def v3_base(tmp_path_factory) -> tuple[Path, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeBERTa-v3-base's shape (2 layers), random, saved; a padded batch of 300, 140 and 17
    tokens ``(3, 300)`` ids and mask, and transformers' float64 states ``(3, 300, 768)`` on
    it: computed once for the backends that are compared with them."""
    import transformers

    folder = tmp_path_factory.mktemp("v3-base")
    config = transformers.DebertaV2Config(**V3_BASE)
    hf = save_random(transformers.DebertaV2Model, config, folder, 7).double()
    ids, mask = fam.padded_batch([300, 140, 17], seed=5, vocab=128100)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    return folder, ids, mask, want


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS_TAKING_IT)
def test_the_v3_base_shape_equals_transformers(v3_base, backend: str) -> None:
    """DeBERTa-v3-base's shape (2 layers): 256 buckets, so texts of 300 and 140 tokens reach
    the log buckets (past 128); padded and packed. Compared in float64 on both sides: at this
    width transformers' own float32 states are about 2.5e-5 from its float64 ones (measured on
    this shape), so 1e-5 in float32 would test the order of the roundings, not the formula (the
    float32 parity at 1e-5 is the tiny size's, above)."""
    folder, ids, mask, want = v3_base
    with torch.no_grad():
        model = BertModel.from_pretrained(folder, backend=backend).double()
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_encode_equals_sentence_transformers(deberta, tmp_path: Path) -> None:
    folder, _ = deberta
    texts = ["the attention head looks at every token", "hello", "a model and a layer, ok"]
    fam.assert_encode_equals_sentence_transformers(folder, SIZES["hidden_size"], texts, tmp_path)


def test_the_tokenizer_transformers_saves_gives_its_ids(deberta) -> None:
    """``DebertaV2Tokenizer``'s folder (tokenizer.json, no spm.model): bertattn's tokenizer
    gives transformers' ids and token types, for texts and pairs."""
    from transformers import AutoTokenizer

    folder, _ = deberta
    theirs = AutoTokenizer.from_pretrained(folder)
    ours = resolve_model(folder).load_tokenizer()
    assert isinstance(ours, BertTokenizer)
    for args in (("the attention heads, ok",), ("hello model", "every token looks at a layer")):
        want = theirs(*args)
        (got,) = ours.encode_batch([args[0]], None if len(args) == 1 else [args[1]])
        assert got.ids == want["input_ids"]
        assert got.type_ids == want["token_type_ids"]


def test_a_sentencepiece_only_folder_is_refused_with_the_fix(deberta, tmp_path: Path) -> None:
    """The hub's DeBERTa-v3 folders ship spm.model without tokenizer.json."""
    folder, _ = deberta
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "spm.model").write_bytes(b"sentencepiece")
    message = (
        r"no tokenizer.json; bertattn reads a DeBERTa-v2 tokenizer from tokenizer.json only, and "
        r"this folder has spm.model, a sentencepiece model\. Write tokenizer.json with "
        r"transformers: AutoTokenizer.from_pretrained\(folder\).save_pretrained\(folder\)"
    )
    with pytest.raises(ModelFolderError, match=message):
        resolve_model(tmp_path).load_tokenizer()


def test_explain_names_the_disentangled_terms(deberta) -> None:
    folder, _ = deberta
    text = fam.explain_varlen(folder, [30, 4])
    assert "disentangled positions: c2p + p2c relative terms added to the scores" in text


def test_a_backend_without_relative_terms_is_refused_by_name(deberta) -> None:
    folder, _ = deberta
    register_backend(BackendSpec("plain_deberta", math_attention, returns_weights=True,
                                 takes=frozenset({"scale"})))  # fmt: skip
    try:
        with pytest.raises(ValueError, match=r"backend 'plain_deberta' cannot add disentangled "
                           r"relative positions \(DeBERTa's content-to-position and "
                           r"position-to-content terms\), and this model has them"):  # fmt: skip
            fam.states(folder, "plain_deberta", *fam.padded_batch([9, 4]))
    finally:
        del BACKENDS["plain_deberta"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"conv_kernel_size": 3}, r"conv_kernel_size=3 is not supported; bertattn loads "
         r"DeBERTa-v2 checkpoints with 0 \(the convolution after the first layer"),
        ({"relative_attention": False}, r"relative_attention=False is not supported; .* "
         r"relative_attention true"),
        ({"pos_att_type": ["c2p", "p2p"]}, r"pos_att_type=\['c2p', 'p2p'\] is not supported; "
         r".* terms from \[\"c2p\", \"p2c\"\]"),
        ({"attention_head_size": 64}, r"attention_head_size=64 is not supported; .* "
         r"hidden_size / num_attention_heads \(30 / 3\)"),
        ({"pooler_hidden_size": 12}, r"pooler_hidden_size=12 is not supported; .* hidden_size"),
        ({"pooler_hidden_act": "nope"}, r"config.json: pooler_hidden_act='nope'"),
        ({"model_type": "deberta"}, r"model_type='deberta' is not supported; bertattn loads "
         r".*'deberta-v2'"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_by_name(tmp_path: Path, override: dict, message: str) -> None:
    fam.assert_config_refused(tmp_path, {**SIZES, "model_type": "deberta-v2", **override}, message)


def test_article_steps_show_the_two_relative_terms(deberta) -> None:
    """The steps of one head and query: c2p and p2c as their own steps, each recomputed here
    from transformers' module (its key and query projections of its normalized relative table,
    its relative positions), and the weights equal to transformers' attention."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    from bertattn import Bert

    folder, hf = deberta
    bert = Bert.load(folder, threads=1)
    text = "the attention head looks at every token"
    steps = bert.attention_steps(text, layer=1, head=2, query=3)
    ids = torch.tensor([bert.tokenizer.encode_batch([text])[0].ids])
    n, d, h = ids.shape[1], 10, 2
    with torch.no_grad():
        out = hf(ids, output_attentions=True, output_hidden_states=True)
        attn = hf.encoder.layer[1].attention.self
        table = hf.encoder.get_rel_embedding()  # (2S, E), normalized
        pos_k = attn.key_proj(table).view(-1, 3, d)[:, h]  # (2S, D): this head's position keys
        pos_q = attn.query_proj(table).view(-1, 3, d)[:, h]
    x = torch.zeros(1, n, 1)  # (B, L, D): only its length is read
    rel = build_relative_position(x, x, bucket_size=8, max_position=64)[0]  # (L, L)
    scale = (3 * d) ** -0.5
    c2p = torch.stack([steps.q @ pos_k[(rel[3, j] + 8).clamp(0, 15)] for j in range(n)]) * scale
    p2c = torch.stack([steps.k[j] @ pos_q[(8 - rel[j, 3]).clamp(0, 15)] for j in range(n)]) * scale
    torch.testing.assert_close(steps.c2p, c2p, atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.p2c, p2c, atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.scaled, steps.scores * scale, atol=1e-6, rtol=0)
    logits = steps.scaled + steps.c2p + steps.p2c + steps.bias
    torch.testing.assert_close(torch.softmax(logits, -1), steps.weights, atol=1e-6, rtol=0)
    torch.testing.assert_close(steps.weights, out.attentions[1][0, h, 3], atol=1e-5, rtol=0)
    formula, table_text = steps.formula(), steps.table()
    assert formula.startswith("Attention(Q, K, V) = softmax((Q·Kᵀ + c2p + p2c) / √(3·d_k) + mask)")
    assert "scaled    = scores / √(3·10) = scores / 5.477" in formula
    assert "c2p       = q · Pk[r(3, j)] / √(3·10)  (DeBERTa's content-to-position term" in formula
    assert "p2c       = k_j · Pq[r'(j, 3)] / √(3·10)  (DeBERTa's position-to-content" in formula
    assert "+c2p    +p2c" in table_text and "/√3d" in table_text
    zh = steps.formula("zh")
    assert "（DeBERTa 的内容到位置项" in zh and "（DeBERTa 的位置到内容项" in zh


def test_attend_explains_a_deberta_head_and_says_why_the_page_has_no_steps(
    deberta, tmp_path: Path, cli
) -> None:
    folder, _ = deberta
    r = cli("attend", "the attention head looks", "--model", folder, "--explain", "1:0:3")
    assert r.code == 0, r
    assert "c2p       = q · Pk[r(3, j)]" in r.out and "+c2p" in r.out
    r = cli("attend", "the attention head looks", "--model", folder, "--html", tmp_path / "a.html")
    assert r.code == 0 and "no steps view for DeBERTa-v2 models" in r.err
    assert "DeBERTa's disentangled attention" in r.err
