"""The bad-input catalogue: every way a user (or a hostile input) can get a job wrong, through
the command line, the Python API and model folders.

For each case: the exit status (2 usage, 1 runtime, 130 interrupted), one ``bertattn ...:
error:`` line that names what was wrong (asserted by text), no traceback, no output file, the
input untouched and no temporary file left (the work folder is byte-for-byte as it was).
The commands run in process (the ``cli`` fixture: ``bertattn.cli.main``); the cases that need a
umask of their own or a real signal run as subprocesses (``cli_subprocess``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bertattn.errors import ModelFolderError, UsageError
from bertattn.files import FolderLock


# ---------------------------------------------------------------------- the work folder
def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` (hidden ones too) -> a hash of its content or 'dir'."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    (d / "in.txt").write_text("hello world\nsecond line\n", encoding="utf-8")
    (d / "d.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    (d / "body.jsonl").write_text('{"id": 1, "body": "x"}\n', encoding="utf-8")
    (d / "num.jsonl").write_text('{"text": 3}\n', encoding="utf-8")
    (d / "broken.jsonl").write_text('{"text": "a"\n', encoding="utf-8")
    (d / "nan.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": NaN, "text": "b"}\n')
    (d / "bad.txt").write_bytes(b"fine\nbroken \xff\xfe here\n")
    (d / "zipped.txt").write_bytes(gzip.compress(b"hello\nworld\n"))  # a .gz under a .txt name
    (d / "afolder.npy").mkdir()
    (d / "afolder.npy" / "x").write_text("someone else's file\n")
    (d / "empty").mkdir()
    (d / "texts").mkdir()
    (d / "texts" / "t.txt").write_text("one\n")
    (d / "damaged.txt.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not gzip data")
    (d / "model.txt").write_text("not a model folder\n")
    os.symlink("d.jsonl", d / "link.jsonl")
    os.link(d / "d.jsonl", d / "hard.jsonl")
    return d


def _check_refused(code: int, err: str, want_code: int, message: str) -> None:
    assert code == want_code, err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    assert errors[0].startswith(("bertattn ", "usage: bertattn")) or "bertattn" in errors[0], err
    assert message in errors[0], err


# ---------------------------------------------------------------------- command line cases
ENC = ["encode"]
CASES: list[tuple[str, list[str], int, str]] = [
    # outputs that would destroy the input or cannot be written
    ("out-is-input", ENC + ["d.jsonl", "-o", "d.jsonl"], 2, "is the input file d.jsonl"),
    ("out-symlink-to-input", ENC + ["d.jsonl", "-o", "link.jsonl"], 2, "is the input file"),
    ("out-hardlink-to-input", ENC + ["d.jsonl", "-o", "hard.jsonl"], 2, "is the input file"),
    ("out-is-folder", ENC + ["in.txt", "-o", "afolder.npy"], 2, "is a folder; give a file name"),
    ("out-missing-folder", ENC + ["in.txt", "-o", "nodir/o.npy"], 2, "nodir does not exist"),
    ("out-unknown-suffix", ENC + ["in.txt", "-o", "o.csv"], 2, "unknown format '.csv'"),
    ("out-no-suffix", ENC + ["in.txt", "-o", "o"], 2, "use .npy or .jsonl"),
    ("out-only-suffix", ENC + ["in.txt", "-o", ".npy"], 2, ".npy is only a suffix; give a name"),
    # names longer than the filesystem takes (NAME_MAX, 255 bytes): refused before any work
    (
        "out-name-too-long",
        ENC + ["in.txt", "-o", "n" * 252 + ".npy"],
        2,
        "the file name is 256 bytes long, over the filesystem's limit of 255 bytes per name",
    ),
    (
        "out-parts-name-too-long",
        ENC + ["in.txt", "-o", "n" * 246 + ".npy", "--resumable"],
        2,
        f"its folder {'n' * 246}.npy.parts: the file name is 256 bytes long, over the",
    ),
    (
        "out-shards-name-too-long",
        ENC + ["in.txt", "-o", "n" * 256 + "/"],
        2,
        "the file name is 256 bytes long, over the filesystem's limit of 255 bytes per name",
    ),
    (
        "attend-name-too-long",
        ["attend", "hi", "--html", "n" * 251 + ".html"],
        2,
        "the file name is 256 bytes long, over the filesystem's limit of 255 bytes per name",
    ),
    # option ranges and combinations, all refused before any work
    ("batch-size-0", ENC + ["in.txt", "-o", "o.npy", "--batch-size", "0"], 2, "--batch-size"),
    ("batch-size-neg", ENC + ["in.txt", "-o", "o.npy", "--batch-size", "-3"], 2, ">= 1, got -3"),
    ("max-length-1", ENC + ["in.txt", "-o", "o.npy", "--max-length", "1"], 2, "--max-length"),
    (
        "max-length-too-big",
        ENC + ["in.txt", "-o", "o.npy", "--max-length", "100000"],
        2,
        "exceeds what the model takes (max_position_embeddings 512)",
    ),
    (
        "cuda-graphs-on-cpu",
        ENC + ["in.txt", "-o", "o.npy", "--device", "cpu", "--cuda-graphs"],
        2,
        "--cuda-graphs needs the PyTorch model on a CUDA device; this run is on cpu",
    ),
    (
        "chunk-size-alone",
        ENC + ["in.txt", "-o", "o.npy", "--chunk-size", "100K"],
        2,
        "--chunk-size applies only to a chunked run",
    ),
    (
        "timeout-alone",
        ENC + ["in.txt", "-o", "o.npy", "--timeout", "5"],
        2,
        "a single process has no other rank to wait for: drop --timeout, or add --workers N",
    ),
    (
        "timeout-one-process",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--timeout", "5"],
        2,
        "a single process has no other rank to wait for",
    ),
    (
        "max-length-2",
        ENC + ["in.txt", "-o", "o.npy", "--max-length", "2"],
        2,
        "--max-length must be an integer >= 3, got 2 ([CLS], [SEP] and at least one token",
    ),
    (
        "onnx-dtype",
        ENC + ["in.txt", "-o", "o.npy", "--onnx", "m.onnx", "--dtype", "bfloat16"],
        2,
        "--dtype bfloat16 applies to the PyTorch model; an --onnx model runs in the precision",
    ),
    (
        "timeout-zero",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--timeout", "0"],
        2,
        "--timeout must be a number of seconds > 0",
    ),
    (
        "timeout-nan",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--timeout", "nan"],
        2,
        "--timeout must be a number of seconds > 0",
    ),
    (
        "chunk-size-0",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--chunk-size", "0"],
        2,
        "--chunk-size '0': expected a size like 512K, 16M or 1G",
    ),
    (
        "chunk-size-unit",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--chunk-size", "12X"],
        2,
        "--chunk-size '12X': expected a size like 512K",
    ),
    ("glob-matches-nothing", ENC + ["nothing-*.txt", "-o", "o.npy"], 2, "matches no file"),
    ("input-folder-empty", ENC + ["empty/", "-o", "o.npy"], 2, "input folder empty holds no file"),
    ("sharded-out-is-file", ENC + ["in.txt", "-o", "in.txt/"], 2, "in.txt is a file; a sharded"),
    (
        "sharded-out-foreign",
        ENC + ["in.txt", "-o", "afolder.npy/"],
        2,
        "holds files bertattn did not write (x)",
    ),
    (
        "sharded-out-holds-input",
        ENC + ["texts/", "-o", "texts/"],
        2,
        "holds the input file texts/t.txt",
    ),
    ("gzip-damaged", ENC + ["damaged.txt.gz", "-o", "o.npy"], 1, "cannot decompress"),
    (
        "resumable-batch-0",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--batch-size", "0"],
        2,
        "--batch-size must be an integer >= 1, got 0",
    ),
    ("workers-0", ENC + ["in.txt", "-o", "o.npy", "--workers", "0"], 2, "--workers must be"),
    (
        "workers-1000",
        ENC + ["in.txt", "-o", "o.npy", "--workers", "1000"],
        2,
        "--workers 1000 is more ranks than this machine can run at once",
    ),
    (
        "workers-onnx",
        ENC + ["in.txt", "-o", "o.npy", "--workers", "2", "--onnx", "m.onnx"],
        2,
        "--onnx runs in a single process",
    ),
    (
        "resumable-onnx",
        ENC + ["in.txt", "-o", "o.npy", "--resumable", "--onnx", "m.onnx"],
        2,
        "--onnx runs in a single process",
    ),
    (
        "onnx-sharded",
        ENC + ["in.txt", "-o", "shards/", "--onnx", "m.onnx"],
        2,
        "--onnx runs in a single process and writes one file, so it cannot go with a folder "
        "output (-o shards/: one .npy shard per chunk); write one file (-o FILE.npy or "
        "FILE.jsonl), or encode with the PyTorch model (drop --onnx).",
    ),
    (
        "onnx-restart",
        ENC + ["in.txt", "-o", "o.npy", "--restart", "--onnx", "m.onnx"],
        2,
        "so it cannot go with --restart; drop --restart, or encode with the PyTorch model",
    ),
    (
        "resumable-stdin",
        ENC + ["-", "-o", "o.npy", "--resumable"],
        2,
        "cannot read stdin",
    ),
    (
        "sharded-stdin",
        ENC + ["-", "-o", "shards/"],
        2,
        "a sharded output (-o FOLDER/, written chunk by chunk) cannot read stdin",
    ),
    ("onnx-missing", ENC + ["in.txt", "-o", "o.npy", "--onnx", "m.onnx"], 2, "m.onnx does not"),
    ("batch-size-text", ENC + ["in.txt", "-o", "o.npy", "--batch-size", "abc"], 2, "invalid int"),
    ("dtype-unknown", ENC + ["in.txt", "-o", "o.npy", "--dtype", "float64"], 2, "invalid choice"),
    ("no-output", ENC + ["in.txt"], 2, "-o/--output"),
    # inputs
    ("input-missing", ENC + ["nothere.txt", "-o", "o.npy"], 2, "nothere.txt does not exist"),
    (
        "input-device-chunked",
        ENC + ["/dev/null", "-o", "o.npy", "--resumable"],
        2,
        "cannot read /dev/null (a pipe or a device)",
    ),
    ("input-bad-utf8", ENC + ["bad.txt", "-o", "o.npy"], 1, "bad.txt: line 2: invalid UTF-8"),
    (
        "input-gzip-as-text",
        ENC + ["zipped.txt", "-o", "o.npy"],
        1,
        "zipped.txt: line 1: this is gzip-compressed data, not text; decompress it first",
    ),
    ("jsonl-broken", ENC + ["broken.jsonl", "-o", "o.npy"], 1, "line 1: not valid JSON"),
    ("jsonl-no-field", ENC + ["body.jsonl", "-o", "o.npy"], 1, "no field 'text' (found: id"),
    ("jsonl-not-str", ENC + ["num.jsonl", "-o", "o.npy"], 1, "field 'text' is a number"),
    (
        "jsonl-nan-id",
        ENC + ["nan.jsonl", "-o", "o.jsonl", "--id-field", "id"],
        1,
        "nan.jsonl: line 2: id field 'id' is or holds NaN, which is not valid JSON",
    ),
    # models
    ("model-missing", ENC + ["in.txt", "-o", "o.npy", "--model", "nomodel/"], 2, "nomodel"),
    ("model-is-file", ENC + ["in.txt", "-o", "o.npy", "--model", "model.txt"], 1, "model.txt"),
    # attend
    ("attend-empty", ["attend", "   "], 2, "TEXT is empty"),
    (
        "attend-gzip-file",
        ["attend", "--file", "zipped.txt"],
        1,
        "zipped.txt: this is gzip-compressed data, not text; decompress it first (zcat FILE",
    ),
    ("attend-empty-pair", ["attend", "hi", "--pair", " "], 2, "--pair is empty"),
    ("attend-layer", ["attend", "hi", "--layer", "6"], 2, "--layer 6 is out of range"),
    ("attend-head", ["attend", "hi", "--head", "12"], 2, "--head 12 is out of range"),
    ("attend-head-neg", ["attend", "hi", "--head", "-1"], 2, "this model has heads 0..11"),
    (
        "attend-one-output-bad",
        ["attend", "hi", "--png", "ok.png", "--html", "nodir/x.html"],
        2,
        "nodir does not exist",
    ),
    ("attend-png-folder", ["attend", "hi", "--png", "afolder.npy"], 2, "is a folder"),
    (
        "attend-same-file-twice",
        ["attend", "hi", "--html", "x.html", "--json", "x.html"],
        2,
        "one file is named for two outputs",
    ),
    (
        "attend-same-file-two-spellings",
        ["attend", "hi", "--html", "x.html", "--json", "texts/../x.html"],
        2,
        "one file is named for two outputs (x.html and texts/../x.html)",
    ),
    ("attend-out-is-file", ["attend", "--file", "in.txt", "--json", "in.txt"], 2, "is the input"),
    (
        "attend-out-links-to-file",
        ["attend", "--file", "d.jsonl", "--html", "link.jsonl"],
        2,
        "--html link.jsonl is the input file d.jsonl; writing it would destroy the input",
    ),
    (
        "attend-stdout-and-explain",
        ["attend", "hi", "--json", "-", "--explain", "0:0:hi"],
        2,
        "--explain prints the article's steps on stdout, where the output asked for as -",
    ),
    (
        "attend-pair-too-short",
        ["attend", "hi", "--pair", "yo", "--max-length", "4"],
        2,
        "--max-length must be an integer >= 5, got 4 ([CLS], [SEP], [SEP] and at least one",
    ),
    ("attend-out-device", ["attend", "hi", "--json", "/dev/null"], 2, "is not a regular file"),
    (
        "attend-layer-with-json-only",
        ["attend", "hi", "--json", "a.json", "--layer", "2"],
        2,
        "--layer does nothing with --json alone: the JSON holds every layer and head",
    ),
    ("attend-model-missing", ["attend", "hi", "--model", "nomodel/"], 2, "nomodel"),
    # export-onnx
    ("export-opset-low", ["export-onnx", "-o", "m.onnx", "--opset", "7"], 2, "opset 7"),
    ("export-opset-high", ["export-onnx", "-o", "m.onnx", "--opset", "99"], 2, "opset 99"),
    ("export-suffix", ["export-onnx", "-o", "m.txt"], 2, "unknown format '.txt'; the format"),
    ("export-folder", ["export-onnx", "-o", "afolder.npy"], 2, "is a folder; give a file name"),
    ("export-stdout", ["export-onnx", "-o", "-"], 2, "not written to stdout; give a file name"),
    ("export-missing-folder", ["export-onnx", "-o", "nodir/m.onnx"], 2, "nodir does not exist"),
    ("export-model-missing", ["export-onnx", "-o", "m.onnx", "--model", "nomodel/"], 2, "nomodel"),
    # bench
    ("bench-json-suffix", ["bench", "--json", "out.txt"], 2, "--json out.txt: unknown format"),
    # the command line itself
    ("no-command", [], 2, "required: COMMAND"),
    ("unknown-command", ["frobnicate"], 2, "invalid choice"),
]


@pytest.mark.parametrize("name, argv, code, message", CASES, ids=[c[0] for c in CASES])
def test_cli_refuses_cleanly(name, argv, code, message, tmp_path, cli):
    work = _work(tmp_path)
    before = _snapshot(work)
    got = cli(*argv, cwd=work)
    _check_refused(got.code, got.err, code, message)
    assert _snapshot(work) == before  # no output, no temp file, the input untouched


def test_catalogue_is_large_enough():
    assert len(CASES) + len(FOLDER_CASES) + len(API_CASES) >= 50


# ---------------------------------------------------------------------- malformed model folders
def _mutate_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / name
        data = json.loads(path.read_text(encoding="utf-8"))
        result = change(data)
        path.write_text(json.dumps(data if result is None else result), encoding="utf-8")

    return apply


def _write(name: str, raw: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(raw)


def _add_tokens(folder: Path) -> None:
    """A tokenizer whose ids go past the model's vocabulary (30522 rows of embeddings)."""
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    for i in range(3):
        vocab[f"zzznew{i}"] = 30522 + i
    path.write_text(json.dumps(data), encoding="utf-8")
    with (folder / "vocab.txt").open("a", encoding="utf-8") as f:
        f.write("".join(f"zzznew{i}\n" for i in range(3)))


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


FOLDER_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("config-not-utf8", _write("config.json", b'{"hidden_size": 384, "x": "\xff"}'), "config.json"),
    ("config-not-json", _write("config.json", b"{not json"), "config.json"),
    ("config-a-list", _write("config.json", b"[1, 2]"), "config.json"),
    (
        "config-nan-eps",
        _mutate_json("config.json", _set("layer_norm_eps", float("nan"))),
        "layer_norm_eps",
    ),
    ("config-str-hidden", _mutate_json("config.json", _set("hidden_size", "384")), "hidden_size"),
    ("config-float-hidden", _mutate_json("config.json", _set("hidden_size", 384.5)), "hidden_size"),
    (
        "config-bool-layers",
        _mutate_json("config.json", _set("num_hidden_layers", True)),
        "num_hidden_layers",
    ),
    ("config-act-int", _mutate_json("config.json", _set("hidden_act", 1)), "hidden_act"),
    ("config-vocab-0", _mutate_json("config.json", _set("vocab_size", 0)), "vocab_size"),
    ("config-pad-huge", _mutate_json("config.json", _set("pad_token_id", 10**9)), "pad_token_id"),
    ("modules-not-list", _write("modules.json", b'{"a": 1}'), "modules.json"),
    ("modules-no-type", _write("modules.json", b'[{"path": ""}]'), "modules.json"),
    (
        "modules-escape",
        _write(
            "modules.json",
            b'[{"type": "sentence_transformers.models.Transformer", "path": "../.."}]',
        ),
        "modules.json",
    ),
    (
        "pooling-two-modes",
        _mutate_json("1_Pooling/config.json", _set("pooling_mode_cls_token", True)),
        "1_Pooling",
    ),
    (
        "pooling-str-bool",
        _mutate_json("1_Pooling/config.json", _set("pooling_mode_mean_tokens", "true")),
        "pooling_mode_mean_tokens",
    ),
    (
        "sbert-max-str",
        _mutate_json("sentence_bert_config.json", _set("max_seq_length", "128")),
        "max_seq_length",
    ),
    (
        "sbert-max-0",
        _mutate_json("sentence_bert_config.json", _set("max_seq_length", 0)),
        "max_seq_length",
    ),
    ("tokenizer-past-vocab", _add_tokens, "vocab"),
]


def _broken_model(minilm_dir: Path, where: Path, mutate: Callable[[Path], None]) -> Path:
    folder = where / "model"
    shutil.copytree(
        minilm_dir.parent,
        folder,
        ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx", "__pycache__", "*.py"),
    )
    target = folder / "model"
    for weights in minilm_dir.glob("*.safetensors"):
        (target / weights.name).symlink_to(weights)
    mutate(target)
    return target


# every case through encode; attend shares the resolver, so three cases cover it there
FOLDER_RUNS = [("encode", *c) for c in FOLDER_CASES] + [
    ("attend", *c)
    for c in FOLDER_CASES
    if c[0] in ("config-nan-eps", "config-str-hidden", "tokenizer-past-vocab")
]


@pytest.mark.parametrize(
    "command, name, mutate, message", FOLDER_RUNS, ids=[f"{r[0]}-{r[1]}" for r in FOLDER_RUNS]
)
def test_malformed_model_folder(command, name, mutate, message, tmp_path, cli, minilm_dir):
    model = _broken_model(minilm_dir, tmp_path, mutate)
    work = _work(tmp_path)
    before = _snapshot(work)
    if command == "encode":
        argv = ["encode", "in.txt", "-o", "o.npy", "--model", str(model)]
    else:
        argv = ["attend", "hello", "--png", "a.png", "--model", str(model)]
    got = cli(*argv, cwd=work)
    _check_refused(got.code, got.err, 1, message)
    assert _snapshot(work) == before


# ---------------------------------------------------------------------- the Python API
def _api_batch_zero(work: Path) -> None:
    from bertattn.jobs import EncodeOptions

    EncodeOptions(str(work / "in.txt"), str(work / "o.npy"), batch_size=0)


def _api_out_is_input(work: Path) -> None:
    from bertattn.jobs import EncodeOptions, run_encode

    run_encode(EncodeOptions(str(work / "d.jsonl"), str(work / "hard.jsonl")))


def _api_attend_outputs(work: Path) -> None:
    from bertattn.jobs import AttendOptions, run_attend

    run_attend(AttendOptions("hi", png=str(work / "a.png"), json=str(work / "no" / "a.json")))


def _api_load_missing(work: Path) -> None:
    from bertattn import Bert

    Bert.load(work / "nomodel")


def _api_export_opset(work: Path) -> None:
    from bertattn.jobs import ExportOptions, run_export

    run_export(ExportOptions(str(work / "m.onnx"), opset=7))


API_CASES: list[tuple[str, Callable[[Path], None], type, str]] = [
    ("api-batch-0", _api_batch_zero, UsageError, "--batch-size must be an integer >= 1"),
    ("api-out-is-input", _api_out_is_input, UsageError, "is the input file"),
    ("api-attend-outputs", _api_attend_outputs, UsageError, "does not exist"),
    ("api-load-missing", _api_load_missing, ModelFolderError, "nomodel"),
    ("api-export-opset", _api_export_opset, UsageError, "opset 7"),
]


@pytest.mark.parametrize("name, call, error, message", API_CASES, ids=[c[0] for c in API_CASES])
def test_python_api_refuses_cleanly(name, call, error, message, tmp_path):
    work = _work(tmp_path)
    before = _snapshot(work)
    with pytest.raises(error, match=message):
        call(work)
    assert _snapshot(work) == before


# ---------------------------------------------------------------------- locks, leftovers, signals
def test_second_resumable_run_on_the_same_output_is_refused(tmp_path, cli):
    work = _work(tmp_path)
    parts = work / "o.npy.parts"
    parts.mkdir()
    with FolderLock(parts, what="o.npy.parts"):  # as a running first run holds it
        got = cli("encode", "in.txt", "-o", "o.npy", "--resumable", cwd=work)
    _check_refused(got.code, got.err, 2, "another bertattn run (process")
    assert not (work / "o.npy").exists()
    assert sorted(p.name for p in parts.iterdir()) == [".lock"]


def test_stale_temp_file_of_a_dead_run_is_removed(tmp_path, cli):
    from bertattn.files import HOST

    work = _work(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = work / f".o.npy.{HOST}-{int(dead.stdout)}-deadbeef.tmp"
    stale.write_bytes(b"half an output")
    alive = work / f".o.npy.{HOST}-{os.getpid()}-cafe.tmp"  # a live writer's: kept
    alive.write_bytes(b"being written")
    got = cli("encode", "in.txt", "-o", "o.npy", "-q", cwd=work)
    assert got.code == 0, got
    assert not stale.exists() and alive.exists()
    assert (work / "o.npy").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: three commands run by ``bertattn.cli.main`` (what ``python -m bertattn`` calls) one after
#: the other in one process, which exits 0 when each exited 0, else names their statuses
_THREE_COMMANDS = """
from bertattn.cli import main

codes = [
    main(argv)
    for argv in (
        ["encode", "in.txt", "-o", "o.npy", "-q"],
        ["encode", "in.txt", "-o", "r.jsonl", "-q", "--resumable"],
        ["attend", "hi", "--json", "a.json", "--html", "a.html"],
    )
]
raise SystemExit(0 if codes == [0, 0, 0] else f"exit statuses {codes}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_get_the_mode_open_would_give(umask, tmp_path, cli_subprocess):
    """A process started with ``umask`` writes each output as ``open()`` would: the three
    commands share one such process (one start-up of torch and the model instead of three)."""
    work = _work(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _THREE_COMMANDS],
        cwd=work,
        env=cli_subprocess.env(),
        umask=umask,  # the process starts with it
        start_new_session=True,  # as cli_subprocess's commands
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("o.npy", "r.jsonl", "a.json", "a.html"):
        assert (work / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_unwritable_folder_is_refused_before_the_work(tmp_path, cli):
    """A folder this process cannot write in: a 0555 folder for a normal user; for root, who
    may write anywhere on a normal filesystem, sysfs (which refuses new files even to root)."""
    work = _work(tmp_path)
    if os.geteuid() == 0:
        folder = Path("/sys")
    else:
        folder = work / "ro"
        folder.mkdir()
        folder.chmod(0o555)
    before = _snapshot(work)
    listing = sorted(os.listdir(folder))
    got = cli("encode", "in.txt", "-o", folder / "o.npy", cwd=work)
    _check_refused(got.code, got.err, 2, f"cannot write in the folder {folder} (Permission denied)")
    assert _snapshot(work) == before and sorted(os.listdir(folder)) == listing


def test_interrupt_in_attend_exits_130_without_traceback(tmp_path, cli, monkeypatch):
    import bertattn.jobs.attend as attend_job

    def interrupted(options):
        raise KeyboardInterrupt

    monkeypatch.setattr(attend_job, "run_attend", interrupted)
    got = cli("attend", "hello", "--png", "a.png", cwd=tmp_path)
    assert got.code == 130 and "interrupted" in got.err and "Traceback" not in got.err, got
    assert not (tmp_path / "a.png").exists()


def test_debug_shows_the_traceback(tmp_path, cli):
    work = _work(tmp_path)
    got = cli("encode", "bad.txt", "-o", "o.npy", "--debug", cwd=work)
    assert got.code == 1 and "Traceback" in got.err and "invalid UTF-8" in got.err, got


def test_missing_extra_names_the_pip_install(tmp_path, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    work = _work(tmp_path)
    before = _snapshot(work)
    got = cli("export-onnx", "-o", "m.onnx", cwd=work)
    _check_refused(got.code, got.err, 1, "pip install 'bertattn[onnx]'")
    assert _snapshot(work) == before


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_start_up_exits_130(tmp_path, cli_subprocess):
    """SIGINT while Python imports torch and loads the model (where Python itself can swallow
    it in an import callback, or turn it into an ImportError): always 130, no traceback, no
    output."""
    import signal
    import time

    for delay in [0.1 * i for i in range(1, 13)]:
        argv = ["attend", "hello there", "--png", "z.png"]
        with cli_subprocess.popen(*argv, cwd=tmp_path, text=True) as proc:
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)  # to the command alone, as before
            err = proc.communicate(timeout=120)[1]
        if proc.returncode == 0:  # finished before the signal: nothing to check
            continue
        assert proc.returncode == 130, (delay, err)
        assert "Traceback" not in err and "Exception ignored" not in err, (delay, err)
        assert err.strip().endswith("bertattn attend: interrupted"), (delay, err)
        assert not (tmp_path / "z.png").exists()
