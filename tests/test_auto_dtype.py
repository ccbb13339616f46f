"""``dtype="auto"`` for ``Bert.load`` and the command line: the machine's fastest dtype, and why
(bertattn/encoder/auto_dtype.py); ``from_pretrained(dtype="auto")`` keeps transformers' meaning."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import test_heads_cross_encoder
import test_heads_pipelines
import torch

import bertattn
from bertattn import Bert, BertModel, DtypeChoice, choose_dtype
from bertattn.bench import environment
from bertattn.encoder import auto_dtype
from bertattn.errors import UsageError
from bertattn.jobs.encode_options import EncodeOptions
from bertattn.jobs.serve_options import ServeOptions

# the reranker and classifier folders of the heads' tests (shared, not built again here)
reranker = test_heads_cross_encoder.reranker
sentiment = test_heads_pipelines.sentiment

AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
AVX512_BF16 = {"avx2", "avx512f", "avx512_bf16"}
#: what the flag rule's reason ends with when BERTATTN_DTYPE_PROBE turned the timing off
NOT_TIMED = " (not timed: BERTATTN_DTYPE_PROBE=0)"


@pytest.fixture(autouse=True)
def _flag_rule(monkeypatch) -> None:
    """These tests hold the flag rule (the fallback): the timed probe is off (its own tests are
    in test_dtype_probe.py)."""
    monkeypatch.setenv("BERTATTN_DTYPE_PROBE", "0")


# ---------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    ("flags", "dtype", "reason"),
    [
        (AMX, torch.bfloat16, auto_dtype.AMX_WHY),
        ({"amx_bf16"}, torch.bfloat16, auto_dtype.AMX_WHY),
        (AVX512_BF16, torch.float32, "AVX512_BF16 without AMX: bf16 measured slower than fp32"),
        ({"avx2", "avx512f"}, torch.float32, "no native bf16 matmul: bf16 emulated"),
        ({"avx2"}, torch.float32, "no native bf16 matmul: bf16 emulated"),
        (set(), torch.float32, "no native bf16 matmul: bf16 emulated"),
    ],
)
def test_cpu_rule_on_injected_flags(flags: set[str], dtype: torch.dtype, reason: str) -> None:
    choice = choose_dtype("cpu", cpu_flags=flags)
    assert choice.dtype == dtype
    assert choice.reason.startswith(reason)
    assert str(choice) == f"{str(dtype).replace('torch.', '')} ({choice.reason})"


@pytest.mark.parametrize(
    ("bf16", "dtype", "word"),
    [(True, torch.bfloat16, "with bf16"), (False, torch.float16, "without")],
)
def test_cuda_rule_on_injected_support(bf16: bool, dtype: torch.dtype, word: str) -> None:
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        choice = choose_dtype(device, cuda_bf16=bf16, cpu_flags=AMX)  # the CPU does not count
        assert choice.dtype == dtype and word in choice.reason and "CUDA" in choice.reason


def test_cuda_rule_asks_torch_when_not_injected(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert choose_dtype("cuda").dtype == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert choose_dtype("cuda").dtype == torch.bfloat16
    assert choose_dtype("auto").dtype == torch.bfloat16  # auto: CUDA when there is one


def test_cpu_rule_reads_this_machines_flags(monkeypatch) -> None:
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: set(AVX512_BF16))
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_family", lambda: 6)
    assert choose_dtype().reason == auto_dtype.AVX512_BF16_WHY + NOT_TIMED
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_family", lambda: 25)  # a Zen 4
    assert choose_dtype().reason == auto_dtype.ZEN4_WHY + NOT_TIMED
    assert choose_dtype().dtype == torch.bfloat16
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: set(AMX))
    assert choose_dtype().dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("vendor", "family", "flags", "dtype"),
    [
        ("AuthenticAMD", 25, AVX512_BF16, torch.bfloat16),  # Zen 4
        ("AuthenticAMD", 25, {"avx2"}, torch.float32),  # Zen 3: no AVX-512, bf16 emulated
        ("AuthenticAMD", 26, AVX512_BF16, torch.float32),  # Zen 5: not measured, the probe decides
        ("GenuineIntel", 6, AVX512_BF16, torch.float32),
        (None, None, AVX512_BF16, torch.float32),  # flags given alone: vendor and family unknown
    ],
)
def test_the_rule_gives_zen_4_bfloat16(vendor, family, flags, dtype) -> None:
    assert auto_dtype.flag_rule(set(flags), vendor=vendor, family=family).dtype == dtype


def test_other_devices_and_bad_ones() -> None:
    assert choose_dtype("meta").dtype == torch.float32
    assert "no measured rule for meta" in choose_dtype("meta").reason
    with pytest.raises(ValueError, match="device 'gpu' is not valid"):
        choose_dtype("gpu")


def test_choice_is_frozen() -> None:
    choice = choose_dtype(cpu_flags=AMX)
    assert isinstance(choice, DtypeChoice) and choice.name == "bfloat16"
    with pytest.raises(AttributeError):
        choice.dtype = torch.float32  # type: ignore[misc]


# ---------------------------------------------------------------------- Bert.load
def test_bert_load_auto_is_the_machine_rule_and_logs_why(caplog) -> None:
    here = choose_dtype("cpu")
    with caplog.at_level(logging.INFO, logger="bertattn"):
        bert = Bert.load(dtype="auto")  # the default model
    assert bert.dtype == here.dtype
    assert bert.dtype_choice == here and bert.dtype_reason == here.reason
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("bertattn")]
    assert f"dtype auto on cpu: {here}" in lines, lines
    plain = Bert.load(dtype="float32")
    assert plain.dtype_choice is None and plain.dtype_reason is None


@pytest.mark.parametrize(
    ("flags", "dtype", "reason"),
    [
        (AMX, torch.bfloat16, auto_dtype.AMX_WHY),
        (AVX512_BF16, torch.float32, auto_dtype.AVX512_BF16_WHY),
        ({"avx2"}, torch.float32, auto_dtype.EMULATED_WHY),
    ],
)
def test_bert_load_auto_follows_the_cpu_flags(
    monkeypatch, tiny_checkpoint: Path, flags: set[str], dtype: torch.dtype, reason: str
) -> None:
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_flags", lambda: set(flags))
    monkeypatch.setattr("bertattn.runtime.cpu.cpu_vendor", lambda: "GenuineIntel")  # not a Zen 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without it: the slow-half warning
        bert = Bert.load(tiny_checkpoint, dtype="auto")
    assert bert.dtype == dtype and bert.dtype_reason == reason + NOT_TIMED


def test_explain_names_the_auto_dtype(tiny_checkpoint: Path) -> None:
    bert = Bert.load(tiny_checkpoint, dtype="auto", threads=1)
    with bertattn.explain() as log:
        bert.encode(["one text", "two texts here"])
    assert f"encode: dtype auto: {choose_dtype()}" in log.notes
    given = Bert.load(tiny_checkpoint, dtype="float32", threads=1)
    with bertattn.explain() as log:
        given.encode(["one text"])
    assert not any("dtype" in n for n in log.notes)


def test_from_pretrained_auto_keeps_the_checkpoints_dtype(tiny_checkpoint: Path, tmp_path) -> None:
    """transformers' meaning: the dtype config.json names, whatever the machine; a float16
    checkpoint shows the difference on any CPU (the machine rule never gives float16 there)."""
    folder = tmp_path / "fp16"
    shutil.copytree(tiny_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert BertModel.from_pretrained(folder, dtype="auto").dtype == torch.float16
        assert BertModel.from_pretrained(folder, torch_dtype="auto").dtype == torch.float16
        assert Bert.load(folder, dtype="auto").dtype == choose_dtype().dtype != torch.float16
    fp32 = BertModel.from_pretrained(tiny_checkpoint, dtype="auto")
    assert fp32.dtype == torch.float32  # a float32 checkpoint stays float32, AMX or not


# ---------------------------------------------------------------------- bench
def test_bench_prints_the_auto_choice_next_to_the_cpu(cli) -> None:
    r = cli("bench", "--dispatch")
    assert r.code == 0, r
    here = choose_dtype("cpu")
    line = next(x for x in r.out.splitlines() if x.startswith("cpu: "))
    assert f"--dtype auto: {here}" in line, line
    assert environment()["auto_dtype"] == here.name


# ---------------------------------------------------------------------- the command line
def test_encode_dtype_auto_resolves_and_says_why(cli, tiny_checkpoint: Path, tmp_path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("one text\ntwo texts here\n")
    out = tmp_path / "o.npy"
    r = cli("encode", src, "-o", out, "--model", tiny_checkpoint, "--dtype", "auto", "-v")
    assert r.code == 0, r
    here = choose_dtype("cpu")
    assert f"bertattn.encoder: dtype auto on cpu: {here}" in r.err, r.err
    assert f"{here.name} on cpu; pooling" in r.err  # the model line: the resolved dtype
    want = Bert.load(tiny_checkpoint, dtype=here.dtype).encode(["one text", "two texts here"])
    np.testing.assert_allclose(np.load(out), want, atol=1e-6)


def test_a_chunked_encode_records_why_auto_chose_in_its_manifest(
    cli, tiny_checkpoint: Path, tmp_path
) -> None:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"text number {i}\n" for i in range(40)))
    out = tmp_path / "emb"
    args = ("encode", src, "-o", f"{out}/", "--model", tiny_checkpoint, "--chunk-size", "200")
    r = cli(*args, "--dtype", "auto")
    assert r.code == 0, r
    manifest = json.loads((out / "manifest.json").read_text())
    here = choose_dtype("cpu")
    assert manifest["settings"]["dtype"] == here.name
    assert manifest["dtype_reason"] == here.reason
    again = cli(*args, "--dtype", "auto")  # the reason is a record, not part of the identity
    assert again.code == 0 and "0 computed" in again.err, again
    fixed = cli(*args, "--dtype", "float32", "-o", f"{tmp_path / 'fixed'}/")
    assert fixed.code == 0, fixed
    assert "dtype_reason" not in json.loads((tmp_path / "fixed" / "manifest.json").read_text())


def test_encode_dtype_auto_with_onnx_is_not_refused(tmp_path) -> None:
    """--onnx runs in float32, which auto may mean; a half dtype is refused as before."""
    common = {"input": str(tmp_path / "in.txt"), "output": str(tmp_path / "o.npy")}
    EncodeOptions(**common, onnx="m.onnx", dtype="auto")
    with pytest.raises(UsageError, match="--dtype bfloat16 applies to the PyTorch model"):
        EncodeOptions(**common, onnx="m.onnx", dtype="bfloat16")


def test_rerank_and_predict_take_dtype_auto(cli, reranker, sentiment, tmp_path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("hello world\nthe attention head looks at every token\n")
    here = choose_dtype("cpu")
    r = cli("rerank", "which head", "-i", docs, "--model", reranker, "--dtype", "auto", "-v")
    assert r.code == 0, r
    assert f"dtype auto on cpu: {here}" in r.err
    want = bertattn.CrossEncoder(reranker, dtype=here.dtype).rank(
        "which head", ["hello world", "the attention head looks at every token"]
    )
    got = [json.loads(line) for line in r.out.splitlines()]
    assert [g["corpus_id"] for g in got] == [w["corpus_id"] for w in want]
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=1e-5)
    r = cli("predict", "-i", docs, "--model", sentiment, "--dtype", "auto", "-v")
    assert r.code == 0, r
    assert f"dtype auto on cpu: {here}" in r.err


def test_serve_takes_dtype_auto_and_info_says_the_resolved_dtype(tiny_checkpoint: Path) -> None:
    from starlette.testclient import TestClient

    from bertattn.serve import create_app

    assert ServeOptions(dtype="auto").dtype == "auto"
    with pytest.raises(UsageError):
        ServeOptions(dtype="float64")
    here = choose_dtype("cpu")
    app = create_app(Bert.load(tiny_checkpoint, dtype="auto", threads=1))
    with TestClient(app) as client:
        info = client.get("/info").json()
    assert (info["dtype"], info["dtype_reason"]) == (here.name, here.reason)
    app = create_app(Bert.load(tiny_checkpoint, threads=1))
    with TestClient(app) as client:
        info = client.get("/info").json()
    assert (info["dtype"], info["dtype_reason"]) == ("float32", None)
