"""ONNX export -> ONNX Runtime parity: tiny random BERT, the real all-MiniLM-L6-v2, bare attention,
`bertattn encode --onnx` (in process: its rows are the claim) and `bertattn export-onnx` (a
subprocess: no exporter noise on the real stderr)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort  # a test dependency: missing means a broken set-up, not a skip
import pytest
import torch
import transformers
from tiny_bert import TINY

from bertattn import Bert, BertModel, MultiHeadAttention
from bertattn.deploy import OnnxBertModel, export_attention_onnx, export_onnx, load_onnx_bert
from bertattn.errors import UsageError

# every test exports a model or runs an export fixture: over ~2 s each on 2 cores
pytestmark = pytest.mark.slow

TOL = 1e-4
# batch 7, padded to 128: lengths 1..128 and one all-padding row
LENGTHS_7 = [1, 3, 17, 64, 128, 100, 0]


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _padded(ids_rows: list[list[int]], width: int, pad_id: int = 0) -> tuple[torch.Tensor, ...]:
    b = len(ids_rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros(b, width, dtype=torch.long)
    types = torch.zeros(b, width, dtype=torch.long)
    for i, row in enumerate(ids_rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
        types[i, len(row) // 2 : len(row)] = 1  # a second segment, so token types matter
    return ids, mask, types


def _check_parity(model: BertModel, session: ort.InferenceSession, batch: tuple) -> None:
    ids, mask, types = batch
    with torch.inference_mode():
        ref = model(ids, mask, types)
    feed = {
        "input_ids": ids.numpy(),
        "attention_mask": mask.numpy(),
        "token_type_ids": types.numpy(),
    }
    hidden, pooled = session.run(["last_hidden_state", "pooler_output"], feed)
    assert hidden.shape == tuple(ref.last_hidden_state.shape)
    assert not np.isnan(hidden).any() and not np.isnan(pooled).any()
    want = ref.last_hidden_state.numpy()
    real = mask.numpy().astype(bool)
    # real tokens (what pooling reads): 1e-4 absolute; measured ~3e-6 on MiniLM
    np.testing.assert_allclose(hidden[real], want[real], atol=TOL, rtol=0)
    # padding positions carry no meaning and are ill-conditioned: a pad query that sees only
    # 4 real keys through 6 layers drifts to ~1.3e-4 on values ~3 (torch's own sdpa vs math
    # differ by 3e-5 there, 15x their real-token gap), so relative as well
    np.testing.assert_allclose(hidden[~real], want[~real], atol=TOL, rtol=TOL)
    np.testing.assert_allclose(pooled, ref.pooler_output.numpy(), atol=TOL, rtol=0)


# ---------------------------------------------------------------------- tiny random model
@pytest.fixture(scope="module")
def tiny_export(tiny_checkpoint, tmp_path_factory):
    # the reference runs the exported backend on the padded batch; eager `auto` would pack a
    # padded batch (varlen) and return zeros at padding positions, which no graph computes
    model = BertModel.from_pretrained(tiny_checkpoint, backend="math").eval()
    path = export_onnx(model, tmp_path_factory.mktemp("tiny_onnx") / "tiny.onnx")
    return model, path


def _random_rows(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, TINY["vocab_size"], (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize(
    "lengths, width",
    [([1], 1), ([128], 128), ([5], 9), (LENGTHS_7, 128), ([4, 9, 2, 0, 11, 7, 1], 11)],
    ids=["b1-L1", "b1-L128", "b1-padded", "b7-L128", "b7-L11"],
)
def test_tiny_bert_onnx_matches_pytorch(tiny_export, lengths, width):
    model, path = tiny_export
    _check_parity(model, _session(path), _padded(_random_rows(lengths, len(lengths)), width))


def test_export_writes_one_file_atomically_with_metadata(tiny_export, tiny_checkpoint, tmp_path):
    _, path = tiny_export
    assert [p.name for p in path.parent.iterdir()] == ["tiny.onnx"]  # no temp file, no .data
    meta = _session(path).get_modelmeta().custom_metadata_map
    assert meta["bertattn.kind"] == "bert" and meta["bertattn.backend"] == "math"
    # from a folder path too; an existing file is replaced whole
    out = tmp_path / "m.onnx"
    out.write_bytes(b"old")
    export_onnx(tiny_checkpoint, out, backend="sdpa")
    sess = _session(out)
    assert sess.get_modelmeta().custom_metadata_map["bertattn.backend"] == "sdpa"
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    _check_parity(tiny_export[0], sess, _padded(_random_rows(LENGTHS_7, 3), 128))


def test_varlen_cannot_be_exported(tiny_export, tmp_path):
    with pytest.raises(
        ValueError, match="'varlen' cannot be exported to ONNX.*depends on the data"
    ):
        export_onnx(tiny_export[0], tmp_path / "x.onnx", backend="varlen")
    with pytest.raises(UsageError, match=r"ONNX file .*x\.onnx: the folder .*nope does not exist"):
        export_onnx(tiny_export[0], tmp_path / "nope" / "x.onnx")
    assert list(tmp_path.iterdir()) == []


def test_onnx_model_engine_errors(tiny_export, tmp_path):
    model, path = tiny_export
    engine = OnnxBertModel(path)  # config from the file's metadata
    assert engine.config == model.config
    with pytest.raises(ValueError, match="attention weights are not exported"):
        engine(torch.ones(1, 3, dtype=torch.long), output_attentions=True)
    other = transformers.BertConfig(**{**TINY, "hidden_size": 48})
    from bertattn import BertConfig

    with pytest.raises(ValueError, match="exported from a different model.*hidden_size=32 vs 48"):
        OnnxBertModel(path, config=BertConfig.from_dict(other.to_dict()))
    attn = tmp_path / "a.onnx"
    export_attention_onnx(MultiHeadAttention(32, 4), attn)
    with pytest.raises(ValueError, match="holds a bertattn 'attention' export"):
        OnnxBertModel(attn)


# ---------------------------------------------------------------------- bare attention
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_attention_onnx_matches_pytorch(tmp_path, backend):
    torch.manual_seed(0)
    module = MultiHeadAttention(32, 4, dropout=0.1, backend="auto")
    path = export_attention_onnx(module, tmp_path / "attn.onnx", backend=backend)
    assert module.backend == "auto" and module.training  # restored after export
    module.eval()
    sess = _session(path)
    for b, width, lengths in [(1, 1, [1]), (7, 128, LENGTHS_7), (3, 5, [5, 2, 0])]:
        x = torch.randn(b, width, 32)
        kpm = _padded([[1] * n for n in lengths], width)[1]
        with torch.inference_mode():
            ref, _ = module(x, key_padding_mask=kpm, need_weights=False)
        (got,) = sess.run(None, {"x": x.numpy(), "key_padding_mask": kpm.numpy()})
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, ref.numpy(), atol=TOL, rtol=0)


# ---------------------------------------------------------------------- the real checkpoint
@pytest.fixture(scope="module")
def minilm_export(minilm_dir, minilm_onnx):
    """The run's one export of MiniLM (conftest's ``minilm_onnx``: ``export_onnx(minilm_dir)``,
    about 50 s, shared with the docs' ``bertattn export-onnx`` block), read only here."""
    bert = Bert.load(minilm_dir, backend="math")  # the exported backend (see tiny_export)
    return bert, minilm_onnx


SENTENCES = [
    "Hi.",
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need, or so the paper says.",
    "BERT encodes every token of a sentence in the context of every other token, layer after "
    "layer, with twelve heads per layer looking at different relations between the words.",
    " ".join(["A very long sentence that keeps going about attention and padding."] * 12),
    "ok",
]


def test_minilm_onnx_matches_pytorch(minilm_export):
    bert, path = minilm_export
    tok = bert.tokenizer
    with pytest.warns(UserWarning, match="1 of 6 inputs were longer than max_length=128"):
        rows = [e.ids for e in tok.encode_batch(SENTENCES, max_length=128)]
    assert max(map(len, rows)) == 128 and min(map(len, rows)) <= 4
    sess = _session(path)
    batch7 = _padded([*rows, []], 128, tok.pad_token_id)  # + an all-padding row
    _check_parity(bert.model, sess, batch7)
    _check_parity(bert.model, sess, _padded(rows[1:2], len(rows[1]), tok.pad_token_id))
    _check_parity(bert.model, sess, _padded([rows[4]], 128, tok.pad_token_id))


def test_encode_cli_onnx_equals_pytorch(minilm_export, tmp_path, cli):
    bert, path = minilm_export
    texts = [*SENTENCES, "", "Padding-only batches must not make NaN."] * 3
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    proc = cli("encode", src, "-o", out, "--onnx", path, "--batch-size", "4")
    assert proc.code == 0, proc
    got = np.load(out)
    assert got.shape == (len(texts), 384) and not np.isnan(got).any()
    np.testing.assert_allclose(got, bert.encode(texts, batch_size=4), atol=TOL, rtol=0)
    # the library engine, same answer
    np.testing.assert_allclose(load_onnx_bert(path, threads=2).encode(texts), got, atol=TOL)


def test_export_onnx_cli(tiny_checkpoint, tiny_export, tmp_path, cli, cli_subprocess):
    out = tmp_path / "cli.onnx"
    proc = cli_subprocess("export-onnx", "--model", tiny_checkpoint, "-o", out)
    err = proc.err
    assert proc.code == 0, proc
    assert proc.out == ""
    assert "wrote" in err and "opset 18, backend math" in err and "Warning" not in err
    _check_parity(tiny_export[0], _session(out), _padded(_random_rows([7, 0, 3], 4), 7))
    bad = cli("export-onnx", "--model", tmp_path / "no", "-o", out)  # in process: a message
    assert bad.code == 2 and "does not exist" in bad.err, bad  # a mistyped path: usage


# ---------------------------------------------------------------------- ORT's BERT optimizer
def test_ort_bert_optimizer_fuses_layernorm_and_gelu_not_attention(tiny_export, tmp_path):
    """What onnxruntime.transformers.optimizer achieves on our export (docs/deploying.md):
    every residual Add + LayerNorm becomes SkipLayerNormalization (the embedding sum too) and
    every MatMul-bias-Gelu becomes BiasGelu. Attention is NOT fused: ORT's BERT attention
    patterns were written for the TorchScript exporter's graph (three Q/K/V MatMul + Add
    chains, a (1 - mask) * -10000 mask); the dynamo exporter's graph of our fused QKV GEMM
    (one MatMul, then Slice / Squeeze per head group) and additive -inf mask does not match
    (Hugging Face's own BertModel exported with dynamo=True is not fused either)."""
    from onnxruntime.transformers.optimizer import optimize_model

    model, path = tiny_export
    layers = TINY["num_hidden_layers"]
    opt = optimize_model(
        str(path),
        model_type="bert",
        num_heads=TINY["num_attention_heads"],
        hidden_size=TINY["hidden_size"],
    )
    fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    assert fused.get("SkipLayerNormalization") == 2 * layers + 1
    assert fused.get("BiasGelu") == layers
    assert fused.get("Attention", 0) == 0 and fused.get("MultiHeadAttention", 0) == 0
    out = tmp_path / "opt.onnx"
    opt.save_model_to_file(str(out))
    _check_parity(model, _session(out), _padded(_random_rows(LENGTHS_7, 5), 128))
