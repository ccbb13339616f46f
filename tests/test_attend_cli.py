"""`bertattn attend` end to end on the real checkpoint, as a user runs it (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertModel as HFBertModel
from transformers import BertTokenizerFast

TEXT = "The animal didn't cross the street because it was too tired."
PAIR = "It stayed on the sidewalk and slept."


@pytest.fixture(scope="module")
def attended(tmp_path_factory, cli) -> tuple[dict, object, Path]:  # (maps, CliResult, folder)
    out = tmp_path_factory.mktemp("attend")
    proc = cli(
        "attend",
        TEXT,
        "--pair",
        PAIR,
        "--json",
        str(out / "a.json"),
        "--png",
        str(out / "a.png"),
        "--html",
        str(out / "a.html"),
        "--rollout",
    )
    assert proc.code == 0, proc
    return json.loads((out / "a.json").read_text()), proc, out


def test_maps_equal_transformers_output_attentions(attended, minilm_dir) -> None:
    """The oracle: transformers' eager BertModel on the same text pair."""
    data, _, _ = attended
    tok = BertTokenizerFast.from_pretrained(str(minilm_dir))
    enc = tok(TEXT, PAIR, return_tensors="pt")
    hf = HFBertModel.from_pretrained(str(minilm_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(**enc, output_attentions=True).attentions
    assert data["tokens"] == tok.convert_ids_to_tokens(enc["input_ids"][0])
    assert data["segment_start"] == enc["token_type_ids"][0].tolist().index(1)
    assert len(data["layers"]) == len(ref) == 6
    for mine, theirs in zip(data["layers"], ref, strict=True):
        np.testing.assert_allclose(np.asarray(mine), theirs[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(np.asarray(mine).sum(-1), 1.0, atol=1e-4)  # rows sum to 1
    roll = np.asarray(data["rollout"])
    assert roll.shape == (len(data["tokens"]),) * 2
    np.testing.assert_allclose(roll.sum(-1), 1.0, atol=1e-4)


def test_outputs_written_and_reported(attended) -> None:
    _, proc, out = attended
    for name in ("a.png", "a.html", "a.json"):  # status on stderr, stdout stays for data
        assert f"bertattn attend: wrote {out / name}" in proc.err
        assert (out / name).stat().st_size > 1000
    assert "6 layers x 12 heads" in proc.err and proc.out == ""


def test_summary_without_outputs_lists_top3(cli) -> None:
    proc = cli("attend", "Paris is the capital of France.", "--layer", "1", "--head", "2")
    assert proc.code == 0, proc
    assert "layer 1, head 2" in proc.out
    assert "paris" in proc.out and "[CLS]" in proc.out
    rows = [line for line in proc.out.splitlines() if "->" in line]
    assert len(rows) == 9  # [CLS] paris is the capital of france . [SEP]
    assert all(line.count("|") == 2 for line in rows)  # three attended tokens each


@pytest.mark.parametrize(
    "args, message",
    [
        (["   "], "TEXT is empty"),
        (["hello", "--layer", "6"], "--layer 6 is out of range: this model has layers 0..5"),
        (["hello", "--head", "-1"], "--head -1 is out of range: this model has heads 0..11"),
        (["hello", "--png", "/nonexistent-dir/a.png"], "does not exist"),
    ],
)
def test_bad_input_is_a_clear_error_without_traceback(cli, args, message) -> None:
    proc = cli("attend", *args)
    assert proc.code == 2, proc
    assert message in proc.err
    assert "Traceback" not in proc.err


@pytest.mark.slow
def test_long_text_is_truncated_and_reported(cli, tmp_path) -> None:
    text = " ".join(["word"] * 600)
    proc = cli("attend", text, "--json", tmp_path / "long.json")
    assert proc.code == 0, proc
    assert "truncated" in proc.err
    data = json.loads((tmp_path / "long.json").read_text())
    assert len(data["tokens"]) == 256  # all-MiniLM-L6-v2's max_seq_length
