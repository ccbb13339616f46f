"""A model name that is neither a local folder nor in the local caches: one line saying what
was looked for, where, and the fix (not huggingface_hub's paragraph), a usage error (exit 2) on
the command line; the short name of the bundled default model means that model."""

from __future__ import annotations

import pytest

import bertattn
from bertattn.encoder.folder import default_model_dir, resolve_model
from bertattn.errors import UsageError

pytest.importorskip("huggingface_hub")


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """An empty working folder beside a folder ``my-reranker``, and an empty hub cache."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-reranker").mkdir()
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.mark.parametrize(
    "name", ["all-MiniLM-L6-v2", "all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"]
)
def test_the_bundled_models_names_resolve_offline(name, nowhere, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(name).root == default_model_dir()


def test_the_short_name_encodes_as_the_default(nowhere, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = ["The cat sat.", "Another text."]
    got = bertattn.Bert.load("all-MiniLM-L6-v2").encode(texts)
    want = bertattn.Bert.load().encode(texts)
    assert (got == want).all()


def test_an_unknown_name_offline_is_one_line_with_the_fix(nowhere, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError) as err:
        resolve_model("my_reranker")
    msg = str(err.value)
    assert "\n" not in msg
    assert "'my_reranker' is not a local folder and is not in the Hugging Face cache" in msg
    assert str(nowhere) in msg and str(nowhere.parent / "my_reranker") in msg  # where it looked
    assert "did you mean ./my-reranker?" in msg
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in msg and "Pass a model folder" in msg
    assert isinstance(err.value, FileNotFoundError)  # still what `except FileNotFoundError` meant


def test_a_hub_that_cannot_be_reached_is_one_line(nowhere, monkeypatch):
    import huggingface_hub

    def unreachable(*args, **kwargs):  # what huggingface_hub raises with no network
        from huggingface_hub.errors import LocalEntryNotFoundError

        raise LocalEntryNotFoundError(
            "Got: ConnectError: [Errno 111] Connection refused\nAn error happened while trying "
            "to locate the files on the Hub, and we cannot find the appropriate snapshot folder"
        ) from ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(UsageError) as err:
        resolve_model("org/no-such-model")
    msg = str(err.value)
    assert "\n" not in msg and "Errno" not in msg and "An error happened" not in msg, msg
    assert "'org/no-such-model' is not a local folder and is not in the Hugging Face cache" in msg
    assert str(nowhere) in msg and "the hub could not be reached" in msg
    assert "Check the name" in msg


def test_the_cli_says_it_in_one_line_with_exit_2(nowhere, cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("encode", "-", "-o", "out.npy", "--model", "my_reranker", input="a text\n")
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r
    assert "'my_reranker' is not a local folder" in lines[0] and "./my-reranker" in lines[0]
    assert not (nowhere.parent / "out.npy").exists()


@pytest.mark.slow  # a real process, and huggingface_hub against a port where nothing listens
def test_the_real_hub_error_is_one_line(nowhere, cli_subprocess):
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(nowhere)}
    r = cli_subprocess("attend", "a text", "--model", "org/no-such-model", env=env, timeout=120)
    assert r.code == 2, r
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "ConnectError" not in r.err, r
    assert "the hub could not be reached" in lines[0] and str(nowhere) in lines[0]
