"""The article's steps on the real checkpoint (``Bert.attention_steps``, ``attend --explain``),
held against transformers' eager attention, and attend's new inputs (stdin, --file,
--max-length, --steps)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from article_code import ARTICLE_LINES

from bertattn import Bert
from bertattn.encoder.steps import find_token

TEXT = "The animal didn't cross the street because it was too tired."
PAIR = "It stayed on the sidewalk and slept."


@pytest.fixture(scope="module")
def bert(minilm_dir):
    return Bert.load(minilm_dir)


@pytest.fixture(scope="module")
def hf(minilm_dir):
    import transformers

    model = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager")
    return model.eval()


def _hf_reference(hf, bert, layer: int, head: int, text: str, pair: str | None):
    """Every step recomputed from transformers' own hidden states and weights."""
    batch = bert.tokenizer([text], None if pair is None else [pair], max_length=bert.max_length)
    with torch.no_grad():
        out = hf(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
            output_hidden_states=True,
            output_attentions=True,
        )
        att = hf.encoder.layer[layer].attention
        x = out.hidden_states[layer][0]  # (L, E): the input of that layer
        d = hf.config.hidden_size // hf.config.num_attention_heads
        cols = slice(head * d, (head + 1) * d)
        q = att.self.query(x)[:, cols]
        k = att.self.key(x)[:, cols]
        v = att.self.value(x)[:, cols]
        weights = out.attentions[layer][0, head]  # (L, L)
        all_v = att.self.value(x)  # (L, E)
        heads = hf.config.num_attention_heads
        contexts = torch.cat(
            [out.attentions[layer][0, h] @ all_v[:, h * d : (h + 1) * d] for h in range(heads)],
            dim=-1,
        )  # (L, E): merged heads
        output = att.output.dense(contexts)
    return {"x": x, "q": q, "k": k, "v": v, "weights": weights, "output": output, "d": d}


@pytest.mark.parametrize(
    "layer, head, query, pair",
    [(2, 0, "it", None), (0, 5, 0, None), (5, 11, -1, None), (3, 7, "slept", PAIR)],
)
def test_steps_equal_transformers_eager(bert, hf, layer, head, query, pair):
    steps = bert.attention_steps(TEXT, layer=layer, head=head, query=query, pair=pair)
    ref = _hf_reference(hf, bert, layer, head, TEXT, pair)
    i = steps.query
    assert steps.tokens[i] == (steps.tokens[find_token(steps.tokens, query)])
    torch.testing.assert_close(steps.x, ref["x"][i], atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.q, ref["q"][i], atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.k, ref["k"], atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.v, ref["v"], atol=1e-5, rtol=0)
    # the article's steps, one by one
    torch.testing.assert_close(steps.scores, steps.k @ steps.q, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(steps.scaled, steps.scores / math.sqrt(ref["d"]))
    assert torch.all(steps.bias == 0)  # one text (or pair), no padding: nothing masked
    torch.testing.assert_close(steps.weights, torch.softmax(steps.scaled, dim=0))
    # the tolerance is what the inputs and float32 allow, measured here (it differs between
    # torch builds, ~1e-6 on torch 2.8): how far the exact (float64) softmax moves between
    # transformers' q, k and ours, plus twice transformers' own float32 rounding of it
    def exact(q, k):  # type: ignore[no-untyped-def]
        return torch.softmax((k.double() @ q.double()) / math.sqrt(ref["d"]), 0)

    theirs = exact(ref["q"][i], ref["k"])
    moved = (exact(steps.q, steps.k) - theirs).abs().max().item()
    rounding = max((ref["weights"][i].double() - theirs).abs().max().item(), 1.2e-7)
    tol = moved + 2 * rounding
    torch.testing.assert_close(steps.weights, ref["weights"][i], atol=tol, rtol=0)
    torch.testing.assert_close(steps.weighted_v.sum(0), steps.context, atol=1e-5, rtol=0)
    torch.testing.assert_close(steps.context, ref["weights"][i] @ ref["v"], atol=1e-5, rtol=0)
    bias = hf.encoder.layer[layer].attention.output.dense.bias
    torch.testing.assert_close(steps.output, ref["output"][i], atol=1e-4, rtol=0)
    # the head's share: its columns of the output projection, and the shares add up
    shares = sum(
        bert.attention_steps(TEXT, layer=layer, head=h, query=i, pair=pair).output_share
        for h in range(bert.model.config.num_attention_heads)
    )
    torch.testing.assert_close(shares + bias, steps.output, atol=1e-4, rtol=0)


def test_steps_weights_are_the_head_view_row(bert):
    """Within one forward the recorded weights are the very ones the head view draws."""
    from bertattn.attention import record_steps

    with record_steps() as rec:
        maps = bert.attention_maps(TEXT, layers=[2], qkv_layers=[2])
    (record,) = rec.records
    assert torch.equal(record.weights[0].float(), torch.from_numpy(maps.layers[0]))
    assert maps.qkv[2]["q"].shape == (12, len(maps.tokens), 32)
    steps = bert.attention_steps(TEXT, layer=2, head=3, query="it")
    assert (
        float((steps.weights - torch.from_numpy(maps.layers[0][3, steps.query])).abs().max()) < 1e-6
    )


def test_find_token_and_errors(bert):
    tokens = ["[CLS]", "the", "Animal", "##s", "[SEP]"]
    assert find_token(tokens, "the") == 1 and find_token(tokens, "animal") == 2
    assert (
        find_token(tokens, "s") == 3
        and find_token(tokens, -1) == 4
        and find_token(tokens, "2") == 2
    )
    with pytest.raises(ValueError, match=r"token 'zebra' is not in the text's tokens"):
        find_token(tokens, "zebra")
    with pytest.raises(ValueError, match=r"token index 9 is out of range: .* 0\.\.4"):
        find_token(tokens, 9)
    with pytest.raises(ValueError, match="head 12 is out of range: this model has heads 0..11"):
        bert.attention_steps(TEXT, layer=0, head=12, query=0)


@pytest.fixture(scope="module")
def explained(cli):  # type: ignore[no-untyped-def]
    """``bertattn attend TEXT --explain 2:0:it`` run once for the tests that read its output."""
    return cli("attend", TEXT, "--explain", "2:0:it", "--lang", "en")  # whatever the locale


def test_explain_in_the_terminal(explained, bert):
    r = explained
    assert r.code == 0, r
    steps = bert.attention_steps(TEXT, layer=2, head=0, query="it")
    rows = [line.split() for line in r.out.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(rows) == len(steps.tokens)
    weights = torch.tensor([float(row[-2]) for row in rows])
    assert float((weights - steps.weights).abs().max()) <= 5e-5  # printed with 4 decimals
    scaled = torch.tensor([float(row[-4]) for row in rows])
    assert float((scaled - steps.scaled).abs().max()) <= 5e-4
    assert "Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k + mask) · V" in r.out
    assert "scores / √32" in r.out and "layer 2, head 0, query 10 'it'" in r.out


def test_explain_shows_the_articles_own_lines(explained):
    """Under the formula, each step's lines as the article writes them, labelled, in order."""
    r = explained
    assert r.code == 0, r
    shown = [
        line.split("article (PyTorch): ", 1)[1] if "article (PyTorch): " in line else line.strip()
        for line in r.out.splitlines()
        if "article (PyTorch): " in line or line.startswith(" " * 33)
    ]
    steps = ("qkv", "split", "scaled", "mask", "softmax", "context", "merge")
    expected = [line for step in steps for line in ARTICLE_LINES[step]]
    assert [line.strip() for line in shown] == [line.strip() for line in expected]
    assert "    scores = scores.masked_fill(mask == 0, -1e9)" in r.out  # under its `if`


def test_text_from_stdin_and_file_and_max_length(cli, tmp_path, tiny_checkpoint_factory):
    # --file and --max-length on a tiny random BERT that takes 512 tokens as the default model
    # does: its JSON holds one map of 512 x 512 weights (one layer, one head) where the default
    # model's holds 6 x 12 (a 400 MB file, about 30 s to write and read back)
    tiny512 = tiny_checkpoint_factory(
        max_position_embeddings=512, num_hidden_layers=1, num_attention_heads=1
    )
    long = " ".join(["word"] * 600)
    (tmp_path / "t.txt").write_text(long + "\n", encoding="utf-8")
    r = cli(
        "attend",
        "--model",
        str(tiny512),
        "--file",
        str(tmp_path / "t.txt"),
        "--max-length",
        "512",
        "--json",
        str(tmp_path / "a.json"),
    )
    assert r.code == 0, r
    assert len(json.loads((tmp_path / "a.json").read_text())["tokens"]) == 512
    r = cli("attend", "-", "--json", str(tmp_path / "b.json"), input="一句话\n")
    assert r.code == 0, r
    assert json.loads((tmp_path / "b.json").read_text())["tokens"][:2] == ["[CLS]", "一"]


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["hi", "--file", "x.txt"], 2, "give the text or --file PATH, not both"),
        ([], 2, "no text: give TEXT, - to read stdin, or --file PATH"),
        (["--file", "nothere.txt"], 2, "--file nothere.txt does not exist"),
        (["hi", "--max-length", "600"], 2, "--max-length 600 exceeds what the model takes"),
        (["hi", "--max-length", "2"], 2, "--max-length must be an integer >= 3, got 2"),
        (["hi", "--pair", "yo", "--max-length", "4"], 2, "must be an integer >= 5, got 4"),
        (["hi", "--explain", "2:0"], 2, "expected LAYER:HEAD:TOKEN"),
        (["hi", "--explain", "x:0:hi"], 2, "expected LAYER:HEAD:TOKEN"),
        (["hi", "--explain", "9:0:hi"], 2, "--explain 9:0:hi: layer 9 is out of range"),
        (["hi", "--explain", "0:0:zebra"], 2, "token 'zebra' is not in the text's tokens"),
        (["hi", "--steps", "1"], 2, "--steps chooses layers for the page's step view; add --html"),
        (["hi", "--html", "p.html", "--steps", "9"], 2, "--steps 9 is out of range"),
        (["hi", "--html", "p.html", "--steps", "a,b"], 2, "expected layer numbers like 0,2 or all"),
    ],
)
def test_attend_refuses_bad_new_options(cli, tmp_path, args, code, message):
    r = cli("attend", *args, cwd=tmp_path)
    assert r.code == code, r
    assert message in r.err and "Traceback" not in r.err
    assert list(tmp_path.iterdir()) == []
