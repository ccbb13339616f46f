"""ONNX opsets: the opset asked for is the opset written, or a refusal before any export work;
a missing ``onnx`` / ``onnxscript`` / ``onnxruntime`` is a MissingExtraError naming the pip
install, raised before the model is loaded."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort  # a test dependency: missing means a broken set-up, not a skip
import pytest
import torch
from tiny_bert import TINY

from bertattn import BertModel, MultiHeadAttention
from bertattn.deploy import (
    DEFAULT_OPSET,
    MAX_OPSET,
    MIN_OPSET,
    OnnxBertModel,
    check_opset,
    export_attention_onnx,
    export_onnx,
)
from bertattn.encoder.config import BertConfig
from bertattn.errors import MissingExtraError

HINT = f"pass --opset {DEFAULT_OPSET} (the default) or another in {MIN_OPSET}..{MAX_OPSET}"


def _default_opset(path) -> list[int]:  # type: ignore[no-untyped-def]
    return [o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")]


def _no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.onnx.export was called")

    monkeypatch.setattr(torch.onnx, "export", fail)


# ---------------------------------------------------------------------- the range check
def test_range_is_the_measured_one():
    # measured with torch 2.13 / onnx 1.23 / onnxscript 0.7 / onnxruntime 1.32 (onnx_export.py)
    assert (MIN_OPSET, DEFAULT_OPSET, MAX_OPSET) == (17, 18, 25)
    assert check_opset(MIN_OPSET) == MIN_OPSET and check_opset(MAX_OPSET) == MAX_OPSET
    assert check_opset(np.int64(20)) == 20 and type(check_opset(np.int64(20))) is int


@pytest.mark.parametrize("opset", [7, 13, MIN_OPSET - 1, 0, -18, MAX_OPSET + 1, 28, 99])
def test_out_of_range_refused(opset):
    with pytest.raises(ValueError) as info:
        check_opset(opset)
    assert str(info.value) == (
        f"opset {opset} is not supported: the exporter writes opsets "
        f"{MIN_OPSET}..{MAX_OPSET}; {HINT}"
    )


@pytest.mark.parametrize("opset", [18.0, "18", None, True, False])
def test_non_int_and_bool_refused(opset):
    with pytest.raises(ValueError) as info:
        check_opset(opset)
    assert str(info.value) == (
        f"opset must be an int, got {opset!r} ({type(opset).__name__}); {HINT}"
    )


def test_export_onnx_refuses_before_loading_or_tracing(tmp_path, monkeypatch):
    _no_trace(monkeypatch)
    out = tmp_path / "m.onnx"
    # a model folder that does not exist: loading it first would raise a different error
    for opset in (7, 99, True):
        with pytest.raises(ValueError, match="not supported|must be an int"):
            export_onnx(tmp_path / "no-such-model", out, opset=opset)
    assert list(tmp_path.iterdir()) == []


def test_export_attention_refuses_without_writing(tmp_path, monkeypatch):
    _no_trace(monkeypatch)
    out = tmp_path / "a.onnx"
    with pytest.raises(ValueError, match=f"opset {MAX_OPSET + 1} is not supported"):
        export_attention_onnx(MultiHeadAttention(8, 2), out, opset=MAX_OPSET + 1)
    with pytest.raises(ValueError, match=f"opset {MIN_OPSET - 1} is not supported"):
        export_attention_onnx("not a module", out, opset=MIN_OPSET - 1)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- exact opset written
@pytest.mark.slow
@pytest.mark.parametrize("opset", [MIN_OPSET, MAX_OPSET])
def test_attention_written_at_exactly_the_opset(tmp_path, opset):
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 2).eval()
    path = export_attention_onnx(module, tmp_path / "a.onnx", opset=opset)
    assert _default_opset(path) == [opset]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 5, 16)
    mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0], [0] * 5])
    with torch.inference_mode():
        ref = module(x, key_padding_mask=mask, need_weights=False)[0]
    (got,) = sess.run(None, {"x": x.numpy(), "key_padding_mask": mask.numpy()})
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("opset", [MIN_OPSET, MAX_OPSET])
def test_bert_written_at_exactly_the_opset(tmp_path, opset):
    # BertModel has ops (LayerNormalization, Gelu) that the bare attention lacks: the range
    # was narrowed for them (16 and 26 are not written exactly for BERT)
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{**TINY, "num_hidden_layers": 1}), backend="math").eval()
    path = export_onnx(model, tmp_path / "b.onnx", opset=opset)
    assert _default_opset(path) == [opset]
    engine = OnnxBertModel(path)
    ids = torch.randint(1, TINY["vocab_size"], (2, 6))
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]])
    with torch.inference_mode():
        ref = model(ids, mask).last_hidden_state
    got = engine(ids, mask).last_hidden_state
    real = mask.bool()
    np.testing.assert_allclose(got[real].numpy(), ref[real].numpy(), atol=1e-4, rtol=0)


def test_exporter_writing_another_opset_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    class Program:  # what the exporter returns when a conversion fails: its own opset 18
        model_proto = onnx.helper.make_model(
            onnx.helper.make_graph([], "g", [], []),
            opset_imports=[onnx.helper.make_opsetid("", 18)],
        )

    monkeypatch.setattr(torch.onnx, "export", lambda *args, **kwargs: Program())
    out = tmp_path / "a.onnx"
    with pytest.raises(RuntimeError, match="wrote opset 18 instead of the requested 19"):
        export_attention_onnx(MultiHeadAttention(8, 2), out, opset=19)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- missing extra
def test_missing_onnxscript_is_missing_extra_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # `import onnxscript` fails
    _no_trace(monkeypatch)
    out = tmp_path / "a.onnx"
    with pytest.raises(MissingExtraError) as info:
        export_attention_onnx(MultiHeadAttention(8, 2), out)
    assert isinstance(info.value, ImportError) and info.value.extra == "onnx"
    assert "'onnxscript'" in str(info.value) and "pip install 'bertattn[onnx]'" in str(info.value)
    # export_onnx checks before loading the model: a missing folder is not what is reported
    with pytest.raises(MissingExtraError, match="onnxscript"):
        export_onnx(tmp_path / "no-such-model", out)
    assert list(tmp_path.iterdir()) == []


def test_missing_onnxruntime_is_missing_extra_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtraError) as info:
        OnnxBertModel(tmp_path / "m.onnx")
    assert info.value.extra == "onnx"
    assert "'onnxruntime'" in str(info.value) and "pip install 'bertattn[onnx]'" in str(info.value)


@pytest.mark.slow
def test_cli_shows_no_exporter_noise_about_another_opset(tmp_path, tiny_checkpoint, cli_subprocess):
    """torch logs "Setting ONNX exporter to use operator set version 18 because the requested
    opset_version 17 is a lower version ..." on stderr: next to bertattn's "opset 17" line (the
    file is converted to 17) it reads as a contradiction, so it is not shown."""
    out = tmp_path / "m.onnx"
    r = cli_subprocess(
        "export-onnx", "--model", str(tiny_checkpoint), "-o", str(out), "--opset", str(MIN_OPSET)
    )
    assert r.code == 0, r
    assert _default_opset(out) == [MIN_OPSET]
    assert "operator set version" not in r.err, r.err
    assert f"opset {MIN_OPSET}" in r.err
