"""resolve_model / ModelFolder: one resolver and validator for every model folder.

Each broken folder is a copy of a good one (all-MiniLM-L6-v2: small files copied, the weights
symlinked; or the tiny random checkpoint) with ONE thing changed; every case must raise
ModelFolderError whose message names the file and the field.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bertattn import Bert, BertConfig, BertModel
from bertattn.encoder.folder import (
    DEFAULT_MODEL_NAME,
    ModelFolder,
    ModelFolderNotFoundError,
    resolve_model,
)
from bertattn.errors import ModelFolderError

ST = "sentence_transformers.models."
MINILM_SMALL = (
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "1_Pooling/config.json",
)


@pytest.fixture
def minilm_copy(minilm_dir: Path, tmp_path: Path) -> Path:
    """all-MiniLM-L6-v2: small files copied, model.safetensors symlinked."""
    folder = tmp_path / "minilm"
    for name in MINILM_SMALL:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(minilm_dir / name, folder / name)
    (folder / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    return folder


@pytest.fixture
def tiny_copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A writable copy of the tiny random Hugging Face folder (vocab_size 99, hidden 32)."""
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "tiny"))


def _edit_json(path: Path, **changes: object) -> Path:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")  # NaN / Infinity written as such
    return path


def _names(path: Path, *fields: str) -> str:
    """A ``match`` pattern: the file's full path, then each field, in that order."""
    return re.escape(str(path)) + "".join(f".*{re.escape(f)}" for f in fields)


# ---------------------------------------------------------------------- good folders
def test_minilm_resolves_with_its_sentence_settings(minilm_dir):
    folder = resolve_model(minilm_dir)
    assert isinstance(folder, ModelFolder)
    assert (folder.pooling, folder.normalize, folder.max_length) == ("mean", True, 256)
    assert folder.root == folder.model_dir == minilm_dir and folder.name == str(minilm_dir)
    assert folder.config.hidden_size == 384 and folder.config.vocab_size == 30522
    default = resolve_model(None)
    assert default.name == DEFAULT_MODEL_NAME and default.root == minilm_dir
    assert resolve_model(default) is default
    names = [p.relative_to(minilm_dir).as_posix() for p in folder.files()]
    assert names[:3] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json"} <= set(names)
    assert all(p.is_file() for p in folder.files())


def test_plain_hf_folder_pools_mean_as_sentence_transformers(tiny_checkpoint):
    folder = resolve_model(tiny_checkpoint)
    assert (folder.pooling, folder.normalize, folder.max_length) == ("mean", False, None)
    assert folder.pooling_given is False
    notice = folder.pooling_notice
    assert notice is not None and str(tiny_checkpoint) in notice and "mean pooling" in notice
    assert folder.model_dir == tiny_checkpoint
    assert [p.name for p in folder.files()] == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "vocab.txt",
        "tokenizer_config.json",
    ]


def test_transformer_in_a_subfolder(tiny_checkpoint, tmp_path):
    """A sentence-transformers folder whose Transformer module is a subfolder: every entry point
    loads the BERT folder inside it."""
    root = tmp_path / "st"
    shutil.copytree(tiny_checkpoint, root / "0_Transformer")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True})
    )
    (root / "0_Transformer" / "sentence_bert_config.json").write_text('{"max_seq_length": 16}')
    modules = [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": ST + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"},
    ]
    (root / "modules.json").write_text(json.dumps(modules))
    folder = resolve_model(root)
    assert folder.model_dir == root / "0_Transformer" and folder.root == root
    assert (folder.pooling, folder.normalize, folder.max_length) == ("cls", False, 16)
    assert folder.pooling_given and folder.pooling_notice is None
    assert BertModel.from_pretrained(root).config.hidden_size == 32
    bert = Bert.load(root)
    assert bert.folder == folder and bert.max_length == 16
    assert bert.encode(["hello world"]).shape == (1, 32)


def test_old_names_still_work(minilm_dir):
    from bertattn.encoder.checkpoint import resolve_model_dir, weight_file
    from bertattn.encoder.pipeline import default_model_dir, read_sentence_settings

    assert default_model_dir() == minilm_dir
    assert resolve_model_dir(minilm_dir) == minilm_dir
    assert weight_file(minilm_dir) == minilm_dir / "model.safetensors"
    s = read_sentence_settings(minilm_dir)
    assert (s.model_dir, s.pooling, s.normalize, s.max_length) == (minilm_dir, "mean", True, 256)


# ---------------------------------------------------------------------- where the name points
def test_path_that_is_a_file(minilm_copy):
    path = minilm_copy / "config.json"
    with pytest.raises(ModelFolderError, match=_names(path, "is a file", str(minilm_copy))):
        resolve_model(path)


def test_missing_folder(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelFolderError, match=_names(missing, "does not exist")) as err:
        resolve_model(missing)
    assert isinstance(err.value, FileNotFoundError)  # old `except FileNotFoundError` still works
    assert isinstance(err.value, ModelFolderNotFoundError)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelFolderError, match=_names(tmp_path, "no config.json")):
        resolve_model(tmp_path)


def test_empty_path_is_not_the_current_folder():
    with pytest.raises(ModelFolderError, match="the model path is empty"):
        resolve_model("")


def test_hub_name_from_cache(tiny_checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = cache / "models--org--tiny" / "snapshots" / commit
    snap.mkdir(parents=True)
    for p in tiny_checkpoint.iterdir():
        shutil.copy(p, snap / p.name)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # "org/tiny" must not exist as a relative folder
    folder = resolve_model("org/tiny")
    assert folder.name == "org/tiny" and folder.root == snap and folder.pooling == "mean"
    assert Bert.load("org/tiny").name == "org/tiny"
    with pytest.raises(FileNotFoundError, match="'org/missing' is not a local folder"):
        resolve_model("org/missing")


@pytest.mark.slow
def test_export_onnx_takes_a_hub_name_like_the_others(tiny_checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("onnxscript")
    from bertattn.deploy import export_onnx

    test_hub_name_from_cache(tiny_checkpoint, tmp_path, monkeypatch)  # the same cache
    out = export_onnx("org/tiny", tmp_path / "tiny.onnx")
    assert out.is_file()


# ---------------------------------------------------------------------- config.json
CONFIG_CASES = [
    ("hidden_size", "384", "hidden_size must be an integer"),
    ("hidden_size", 384.5, "hidden_size must be an integer"),
    ("hidden_size", 384.0, "hidden_size must be an integer"),
    ("hidden_size", True, "hidden_size must be an integer"),
    ("layer_norm_eps", float("nan"), "layer_norm_eps must be > 0 (a finite number)"),
    ("layer_norm_eps", float("inf"), "layer_norm_eps must be > 0 (a finite number)"),
    ("layer_norm_eps", -1, "layer_norm_eps must be > 0 (a finite number), got -1"),
    ("layer_norm_eps", "x", "layer_norm_eps must be > 0 (a finite number)"),
    (
        "hidden_dropout_prob",
        float("nan"),
        "hidden_dropout_prob must be in [0, 1) (a finite number), got NaN",
    ),
    ("hidden_act", 1, "hidden_act must be a string"),
    ("vocab_size", 0, "vocab_size must be an integer >= 1"),
    ("num_hidden_layers", None, "num_hidden_layers must be an integer"),
    ("pad_token_id", 1e9, "pad_token_id must be an integer"),
    ("pad_token_id", 30522, "pad_token_id must be an integer in [0, 30521] or null"),
]


@pytest.mark.parametrize(("key", "value", "message"), CONFIG_CASES)
def test_config_value_refused(minilm_copy, key, value, message):
    path = _edit_json(minilm_copy / "config.json", **{key: value})
    with pytest.raises(ModelFolderError, match=_names(path, message)):
        resolve_model(minilm_copy)


def test_config_pad_token_id_null_is_accepted(minilm_copy):
    _edit_json(minilm_copy / "config.json", pad_token_id=None)
    assert resolve_model(minilm_copy).config.pad_token_id is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"hidden_size": 384, "x": "caf\xe9"}', "not UTF-8 text"),
        (b'{"hidden_size": 384,', "not valid JSON"),
        (b"[384, 6]", "expected a JSON object"),
        (b'"bert"', "expected a JSON object"),
    ],
    ids=["latin-1", "truncated", "list", "string"],
)
def test_config_file_refused(minilm_copy, content, message):
    path = minilm_copy / "config.json"
    path.write_bytes(content)
    with pytest.raises(ModelFolderError, match=_names(path, message)):
        resolve_model(minilm_copy)


def test_every_entry_point_refuses_the_same_way(tiny_copy, tmp_path):
    """Bert.load, BertModel.from_pretrained, export_onnx and load_onnx_bert all resolve
    through resolve_model: the NaN that used to give NaN embeddings silently is refused."""
    from bertattn.deploy.onnx_export import export_onnx
    from bertattn.deploy.onnx_runtime import load_onnx_bert

    path = _edit_json(tiny_copy / "config.json", layer_norm_eps=float("nan"))
    pattern = _names(path, "layer_norm_eps must be > 0 (a finite number)", "got NaN")
    for load in (
        lambda: Bert.load(tiny_copy),
        lambda: BertModel.from_pretrained(tiny_copy),
        lambda: export_onnx(tiny_copy, tmp_path / "x.onnx"),
        lambda: load_onnx_bert(tmp_path / "x.onnx", tiny_copy),
    ):
        with pytest.raises(ModelFolderError, match=pattern):
            load()


def test_bert_config_checks_python_values_too():
    with pytest.raises(ValueError, match=r"BertConfig: hidden_size must be an integer"):
        BertConfig(hidden_size=384.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"BertConfig: layer_norm_eps must be > 0 \(a finite number\), got NaN"
    ):
        BertConfig(layer_norm_eps=float("nan"))
    with pytest.raises(ValueError, match=r"BertConfig: hidden_act must be a string"):
        BertConfig(hidden_act=1)  # type: ignore[arg-type]
    with pytest.raises(ModelFolderError, match=r"^my source: vocab_size must be an integer"):
        BertConfig.from_dict({"vocab_size": "30522"}, source="my source")


# ---------------------------------------------------------------------- modules.json
def _modules(folder: Path) -> list:
    return json.loads((folder / "modules.json").read_text())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: {"modules": m}, "expected a JSON array of modules"),
        (lambda m: [m[0], "1_Pooling", m[2]], "entry 1 is a JSON string, not an object"),
        (lambda m: [{"path": ""}, *m[1:]], "entry 0: 'type' must be a string (missing)"),
        (lambda m: [{**m[0], "path": 0}, *m[1:]], "entry 0: 'path' must be a string (got 0)"),
        (
            lambda m: [m[0], {**m[1], "path": "../1_Pooling"}, m[2]],
            "entry 1: path '../1_Pooling' leaves the model folder",
        ),
        (
            lambda m: [m[0], {**m[1], "path": "/etc"}, m[2]],
            "entry 1: path '/etc' leaves the model folder",
        ),
        (
            lambda m: [m[0], {**m[1], "path": "9_Pooling"}, m[2]],
            "entry 1: the Pooling folder",
        ),
        (
            lambda m: [*m, {"path": "3_LayerNorm", "type": ST + "LayerNorm"}],
            f"entry 3: module type '{ST}LayerNorm' is not supported",
        ),
        (lambda m: [m[0], m[2], m[1]], f"entry 2: {ST}Pooling comes after {ST}Normalize"),
        (
            lambda m: [*m, {"path": "3_Dense", "type": ST + "Dense"}],
            f"entry 3: {ST}Dense comes after {ST}Normalize",
        ),
        (lambda m: m[1:], f"entry 0: {ST}Pooling before any {ST}Transformer"),
        (lambda m: [], f"no {ST}Transformer module"),
    ],
    ids=[
        "object",
        "string-entry",
        "no-type",
        "path-int",
        "dotdot",
        "absolute",
        "missing-folder",
        "unknown-type",
        "order",
        "dense-after-normalize",
        "no-transformer-first",
        "empty",
    ],
)
def test_modules_json_refused(minilm_copy, edit, message):
    path = minilm_copy / "modules.json"
    path.write_text(json.dumps(edit(_modules(minilm_copy))))
    with pytest.raises(ModelFolderError, match=_names(path, message)):
        resolve_model(minilm_copy)


# ---------------------------------------------------------------------- pooling config
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pooling_mode_mean_tokens": "true"}, "pooling_mode_mean_tokens must be true or false"),
        ({"pooling_mode_cls_token": True}, "exactly one pooling_mode_* must be true, found 2"),
        ({"pooling_mode_mean_tokens": False}, "exactly one pooling_mode_* must be true, found 0"),
        (
            {"pooling_mode_mean_tokens": False, "pooling_mode_weightedmean_tokens": True},
            "pooling_mode_weightedmean_tokens is not supported",
        ),
        ({"word_embedding_dimension": 768}, "word_embedding_dimension=768 but"),
        ({"word_embedding_dimension": "384"}, "word_embedding_dimension must be an integer"),
    ],
    ids=["string-true", "two-modes", "no-mode", "max", "dimension", "dimension-string"],
)
def test_pooling_config_refused(minilm_copy, changes, message):
    path = _edit_json(minilm_copy / "1_Pooling" / "config.json", **changes)
    with pytest.raises(ModelFolderError, match=_names(path, message)):
        resolve_model(minilm_copy)


def test_pooling_config_not_an_object(minilm_copy):
    path = minilm_copy / "1_Pooling" / "config.json"
    path.write_text('["mean"]')
    with pytest.raises(ModelFolderError, match=_names(path, "expected a JSON object")):
        resolve_model(minilm_copy)


def test_pooling_config_missing(minilm_copy):
    path = minilm_copy / "1_Pooling" / "config.json"
    path.unlink()
    with pytest.raises(ModelFolderError, match=_names(path, "does not exist")):
        resolve_model(minilm_copy)


# ---------------------------------------------------------------------- sentence_bert_config
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_seq_length": "128"}, "max_seq_length must be an integer >= 1 or null"),
        ({"max_seq_length": 0}, "max_seq_length must be an integer >= 1 or null, got 0"),
        ({"max_seq_length": -5}, "max_seq_length must be an integer >= 1 or null, got -5"),
        ({"max_seq_length": 128.0}, "max_seq_length must be an integer"),
        ({"do_lower_case": "no"}, "do_lower_case must be true or false"),
    ],
    ids=["string", "zero", "negative", "float", "lower-case-string"],
)
def test_sentence_bert_config_refused(minilm_copy, changes, message):
    path = _edit_json(minilm_copy / "sentence_bert_config.json", **changes)
    with pytest.raises(ModelFolderError, match=_names(path, message)):
        resolve_model(minilm_copy)


def test_sentence_bert_config_null_length_uses_the_tokenizer(minilm_copy):
    _edit_json(minilm_copy / "sentence_bert_config.json", max_seq_length=None)
    assert resolve_model(minilm_copy).max_length is None


# ---------------------------------------------------------------------- tokenizer vs model
def test_tokenizer_bigger_than_vocab_size(tiny_copy, minilm_dir, tmp_path):
    """MiniLM's tokenizer (30522 tokens) on the tiny model (vocab_size 99): refused at load,
    not an IndexError in the embedding at the first long word."""
    from bertattn.deploy.onnx_runtime import load_onnx_bert

    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, tiny_copy / name)
    pattern = _names(
        tiny_copy / "tokenizer.json", "30522 tokens", "largest id 30521", "vocab_size=99"
    )
    resolve_model(tiny_copy)  # the files themselves are fine
    with pytest.raises(ModelFolderError, match=pattern):
        Bert.load(tiny_copy)
    with pytest.raises(ModelFolderError, match=pattern):  # before the ONNX file is opened
        load_onnx_bert(tmp_path / "not-there.onnx", tiny_copy)


def test_added_token_beyond_vocab_size(tiny_copy):
    from tokenizers import Tokenizer

    path = tiny_copy / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.add_tokens(["[NEW]"])  # id 99 == vocab_size
    tok.save(str(path))
    with pytest.raises(ModelFolderError, match=_names(path, "largest id 99", "vocab_size=99")):
        Bert.load(tiny_copy)


def test_vocab_txt_bigger_than_vocab_size(tiny_copy):
    (tiny_copy / "tokenizer.json").unlink()
    path = tiny_copy / "vocab.txt"
    path.write_text(path.read_text() + "extra\n")
    with pytest.raises(ModelFolderError, match=_names(path, "100 tokens", "vocab_size=99")):
        Bert.load(tiny_copy)


def test_tokenizer_config_refused(tiny_copy):
    path = _edit_json(tiny_copy / "tokenizer_config.json", model_max_length="512")
    with pytest.raises(ModelFolderError, match=_names(path, "model_max_length must be")):
        Bert.load(tiny_copy)


def test_one_token_type_refuses_pairs_only(tiny_checkpoint_factory):
    bert = Bert.load(tiny_checkpoint_factory(type_vocab_size=1))
    assert bert.encode(["hello world"]).shape == (1, 32)  # single texts: type 0 only
    assert bert.attention_maps("hello world").tokens
    config = bert.folder.config_path
    with pytest.raises(ModelFolderError, match=_names(config, "type_vocab_size=1", "pair")):
        bert.attention_maps("hello", pair="world")
