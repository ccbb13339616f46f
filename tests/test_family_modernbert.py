"""ModernBERT in bertattn's own encoder: random ``ModernBertModel`` folders (tiny odd sizes,
seeded noise on every parameter, a window far smaller than the inputs) saved by transformers,
against transformers' native class on padded batches and packed mixed lengths, on every
backend; ``Bert.encode`` against sentence-transformers; bad folders refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_helpers import assert_encode_equals_sentence_transformers, copy_with_config
from tiny_bert import save_random

from bertattn import Bert, BertModel
from bertattn.attention import dispatch
from bertattn.errors import ModelFolderError

SIZES = dict(
    vocab_size=99, hidden_size=36, num_hidden_layers=5, num_attention_heads=3,
    intermediate_size=29, max_position_embeddings=600, local_attention=6,
    global_attn_every_n_layers=2, pad_token_id=0, cls_token_id=2, sep_token_id=3,
    bos_token_id=2, eos_token_id=3,
)  # fmt: skip
TEXTS = [
    "the attention head looks at every token in the sentence and weighs it",
    "hello",
    "a model and a layer, ok",
    "first second " * 30,
]


def save_modernbert(folder: Path, tokenizer_from: Path, seed: int = 0, **overrides: object):  # type: ignore[no-untyped-def]
    import transformers

    config = transformers.ModernBertConfig(**{**SIZES, **overrides})
    return save_random(transformers.ModernBertModel, config, folder, seed, tokenizer_from)


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory, tiny_checkpoint) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("modernbert")
    return folder, save_modernbert(folder, tiny_checkpoint)


def _batch(lengths: list[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.randint(5, 99, (len(lengths), n), generator=g)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def _theirs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
def test_hidden_states_equal_transformers(modernbert, backend: str) -> None:
    folder, hf = modernbert
    ids, mask = _batch([37, 12, 25, 3])
    want = _theirs(hf, ids, mask)
    ours = BertModel.from_pretrained(folder, backend=backend)
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    assert ours.pooler is None


def test_inputs_far_longer_than_the_window(modernbert) -> None:
    """A window of +-3 on 400 tokens: a global-attention bug cannot pass, and packed runs skip
    the keys out of reach (explain() says so)."""
    folder, hf = modernbert
    ids, mask = _batch([400, 170, 9], seed=2)
    want = _theirs(hf, ids, mask)
    ours = BertModel.from_pretrained(folder, backend="varlen")
    ours.chunk_tokens = 0  # one batch (row chunks would count the sequences per chunk)
    with torch.no_grad(), dispatch.explain() as ex:
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    text = str(ex)
    assert "window 3: exploited on 2 of 3 sequences" in text
    assert "rotary positions (theta 10000" in text and "rotary positions (theta 160000" in text
    # and the window matters: transformers with every layer global gives other states
    import transformers

    glob = transformers.ModernBertModel(
        transformers.ModernBertConfig(**{**SIZES, "global_attn_every_n_layers": 1})
    ).eval()
    glob.load_state_dict(hf.state_dict())
    assert not torch.allclose(_theirs(glob, ids, mask)[keep], want[keep], atol=1e-3)


@pytest.mark.parametrize("lengths", [[400, 170, 9], [300]])
def test_padded_sdpa_skips_the_keys_out_of_reach(modernbert, lengths) -> None:
    """The padded path (sdpa) on inputs far past the window: blocked local attention with the
    padding as a per-key bias, equal to transformers; a padding query with no key in reach
    gets zeros, never NaN."""
    folder, hf = modernbert
    ids, mask = _batch(lengths, seed=3)
    want = _theirs(hf, ids, mask)
    ours = BertModel.from_pretrained(folder, backend="sdpa")
    ours.chunk_tokens = 0
    with torch.no_grad(), dispatch.explain() as ex:
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)
    assert not torch.isnan(got).any()
    assert "window 3: exploited (query blocks see only the keys in reach" in str(ex)


def test_attention_weights_show_the_window(modernbert) -> None:
    folder, _ = modernbert
    ids, mask = _batch([20])
    out = BertModel.from_pretrained(folder)(
        input_ids=ids, attention_mask=mask, output_attentions=True
    )
    local = out.attentions[1][0]  # layer 1 is local: (H, L, L)
    i = torch.arange(20)
    outside = (i[:, None] - i[None, :]).abs() > 3
    assert torch.all(local[:, outside] == 0) and torch.all(local[:, ~outside] > 0)
    assert torch.all(out.attentions[0][0] > 0)  # layer 0 is global


def test_bfloat16_close_to_float32(modernbert) -> None:
    folder, _ = modernbert
    ids, mask = _batch([30, 11])
    with torch.no_grad():
        f32 = BertModel.from_pretrained(folder)(input_ids=ids, attention_mask=mask)
        bf16 = BertModel.from_pretrained(folder, dtype=torch.bfloat16)(
            input_ids=ids, attention_mask=mask
        )
    keep = mask.bool()
    cos = torch.nn.functional.cosine_similarity(
        f32.last_hidden_state[keep], bf16.last_hidden_state[keep].float(), dim=-1
    )
    assert cos.min() > 0.999


def test_encode_equals_sentence_transformers(modernbert, tmp_path) -> None:
    folder, _ = modernbert
    assert_encode_equals_sentence_transformers(folder, SIZES["hidden_size"], TEXTS, tmp_path)


def test_bert_load_encodes_and_explains(modernbert) -> None:
    folder, _ = modernbert
    bert = Bert.load(folder, threads=1)
    rows = bert.encode(TEXTS)
    assert rows.shape == (len(TEXTS), SIZES["hidden_size"])
    assert bert.model.config.family == "modernbert"


# ---------------------------------------------------------------------- bad folders
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"layer_types": ["full_attention"] * 3},
            r"layer_types has 3 entries but num_hidden_layers is 5",
        ),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}},
            r"rope_parameters.full_attention.rope_type='yarn' is not supported",
        ),
        ({"local_attention": 2000}, r"local_attention=2000 is larger than the model"),
        ({"hidden_activation": "mish"}, r"hidden_activation='mish' is not supported"),
    ],
)
def test_bad_configs_are_refused_by_field(modernbert, tmp_path, changes, message) -> None:
    folder = copy_with_config(modernbert[0], tmp_path / "bad", **changes)
    with pytest.raises(ModelFolderError, match=message) as err:
        BertModel.from_pretrained(folder)
    assert "config.json" in str(err.value)


def test_a_missing_tensor_is_named(modernbert, tmp_path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "missing"
    shutil.copytree(modernbert[0], folder)
    state = load_file(folder / "model.safetensors")
    del state["layers.2.mlp.Wi.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ModelFolderError, match=r"missing tensors: layers\.2\.mlp\.Wi\.weight"):
        BertModel.from_pretrained(folder)


def test_unknown_model_type_lists_the_registry(tmp_path, tiny_checkpoint) -> None:
    folder = copy_with_config(tiny_checkpoint, tmp_path / "t5", model_type="t5")
    with pytest.raises(ModelFolderError, match=r"model_type='t5' is not supported") as err:
        BertModel.from_pretrained(folder)
    assert "'modernbert'" in str(err.value) and "'bert'" in str(err.value)


# ---------------------------------------------------------------------- jobs
def test_jobs_refuse_what_the_family_cannot_do_by_name(modernbert) -> None:
    from bertattn.encoder import GraphedBert
    from bertattn.families import registry

    folder, _ = modernbert
    model = BertModel.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"GraphedBert is not available for ModernBERT models"):
        GraphedBert(model)
    bert = Bert.load(folder, threads=1)
    with pytest.raises(ValueError, match=r"no step for ModernBERT's rotary positions"):
        bert.attention_maps("hello world", qkv_layers=[0])
    assert registry.get("modernbert").can("onnx") and not registry.get("modernbert").can("steps")
    assert registry.get("modernbert").can("int8")  # tests/test_int8_blocks.py runs it


def test_attend_page_without_steps_says_why(modernbert, tmp_path, cli) -> None:
    folder, _ = modernbert
    page = tmp_path / "a.html"
    r = cli("attend", "the attention head looks", "--model", folder, "--html", page)
    assert r.code == 0, r
    assert "no steps view for ModernBERT models" in r.err and page.is_file()
    r = cli("attend", "the attention head", "--model", folder, "--html", tmp_path / "b.html",
            "--steps", "0")  # fmt: skip
    assert r.code == 2 and "--steps: the page's steps view" in r.err
    assert not (tmp_path / "b.html").exists()
    r = cli("attend", "the attention head looks", "--model", folder, "--explain", "1:0:looks")
    assert r.code == 0 and "q·k" in r.out


def test_article_steps_show_the_rotation_and_the_window(modernbert) -> None:
    """The steps of a local layer: q and k before and after the rotation (transformers' own
    rotation of the recorded q gives the recorded one), the window as the mask, and the
    weights equal to transformers' eager attention."""
    import transformers
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    folder, _ = modernbert
    bert = Bert.load(folder, threads=1)
    text = "the attention head looks at every token"
    steps = bert.attention_steps(text, layer=1, head=2, query=4)
    assert steps.theta == 10000.0 and steps.window == 3
    d = steps.head_dim
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.arange(len(steps.tokens)).float()[:, None] * inv
    emb = torch.cat([ang, ang], -1)
    q_turned, k_turned = apply_rotary_pos_emb(
        steps.q_before[None, None, None].expand(1, 1, len(steps.tokens), d),
        steps.k_before[None, None],
        emb.cos()[None],
        emb.sin()[None],
    )
    torch.testing.assert_close(q_turned[0, 0, 4], steps.q, atol=1e-5, rtol=0)
    torch.testing.assert_close(k_turned[0, 0], steps.k, atol=1e-5, rtol=0)
    outside = (torch.arange(len(steps.tokens)) - 4).abs() > 3
    assert torch.all(torch.isinf(steps.bias[outside])) and torch.all(steps.bias[~outside] == 0)
    ids = torch.tensor([bert.tokenizer.encode_batch([text])[0].ids])
    theirs = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        want = theirs(ids, output_attentions=True).attentions[1][0, 2, 4]
    torch.testing.assert_close(
        torch.softmax(steps.scaled + steps.bias, -1), want, atol=1e-6, rtol=1e-5
    )
    assert "rotate    = q and k turned" in steps.formula() and "win" in steps.table()


def test_every_job_runs_on_modernbert(modernbert, tmp_path, cli, cli_subprocess) -> None:
    """encode (the CLI, resumable corpus output), serve (a real server on a free loopback
    port, the OpenAI embeddings body) and the Python rows agree."""
    from serve_server import assert_encode_and_serve_give

    folder, _ = modernbert
    want = Bert.load(folder, threads=1).encode(TEXTS)
    _, info = assert_encode_and_serve_give(cli, cli_subprocess, folder, TEXTS, want, tmp_path)
    assert "modernbert" in json.dumps(info)


# ---------------------------------------------------------------------- heads
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_modernbert_classifier_is_a_cross_encoder(modernbert, tmp_path, pooling) -> None:
    """``ModernBertForSequenceClassification`` (its own head: pooling, dense, GELU, LayerNorm,
    then the classifier): CrossEncoder logits equal to transformers', scores to
    sentence-transformers' CrossEncoder (the gte-reranker-modernbert-base kind)."""
    import transformers
    from family_helpers import assert_reranker_equals_peers

    config = transformers.ModernBertConfig(**SIZES, num_labels=1, classifier_pooling=pooling)
    torch.manual_seed(0)
    model = transformers.ModernBertForSequenceClassification(config).eval()
    pairs = [
        ("the attention head", "looks at every token " * 6),  # past the window of +-3
        ("hello", "a model and a layer"),
        ("first second", "ok"),
    ]
    assert_reranker_equals_peers(model, modernbert[0], 7, pairs, tmp_path)


def test_a_modernbert_masked_lm_fills_masks_as_transformers(modernbert, tmp_path) -> None:
    """``ModernBertForMaskedLM`` (its prediction head, the decoder tied to the embeddings, a
    decoder bias): the fill-mask pipeline's tokens and scores equal transformers'."""
    import numpy as np
    import transformers

    import bertattn

    folder, _ = modernbert
    config = transformers.ModernBertConfig(**SIZES)
    save_random(transformers.ModernBertForMaskedLM, config, tmp_path / "mlm", 8, folder)
    texts = ["the attention [MASK] looks at every token", "hello [MASK], a model"]
    theirs = transformers.pipeline("fill-mask", model=str(tmp_path / "mlm"), top_k=5)
    ours = bertattn.pipeline("fill-mask", tmp_path / "mlm", top_k=5)
    for text in texts:
        got, want = ours(text), theirs(text)
        assert [g["token"] for g in got] == [w["token"] for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)
