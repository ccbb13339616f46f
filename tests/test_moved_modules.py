"""``bertattn.bert`` was split into ``bertattn.encoder`` and ``bertattn.runtime``, and the
top-level ``threads``, ``cpu`` and ``openmp`` moved into ``runtime``: the old names import the
same module objects for one release, each with a DeprecationWarning naming the new place."""

from __future__ import annotations

import subprocess
import sys

import pytest

MOVED = {
    "bertattn.bert.int8": "bertattn.encoder.int8",
    "bertattn.bert.pipeline": "bertattn.encoder.pipeline",
    "bertattn.bert.folder": "bertattn.encoder.folder",
    "bertattn.bert.probe": "bertattn.runtime.probe",
    "bertattn.bert.workers": "bertattn.runtime.workers",
    "bertattn.bert.device": "bertattn.runtime.device",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_submodule_is_the_new_module(old: str, new: str) -> None:
    """In a fresh interpreter, so this worker's modules keep their own names; the moved module
    keeps its own spec too (its relative imports resolve without an ImportWarning)."""
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    moved = importlib.import_module({old!r})\n"
        f"print(moved is importlib.import_module({new!r}), moved.__spec__.name)\n"
        "print(any('bertattn.bert is deprecated' in str(w.message) for w in seen))\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error::ImportWarning", "-c", code],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.split() == ["True", new, "True"], out


@pytest.mark.parametrize("name", ["threads", "cpu", "openmp"])
def test_top_level_names_warn_and_give_the_runtime_module(name: str) -> None:
    """In a fresh interpreter (a module imports once per process)."""
    code = (
        "import warnings, importlib\n"
        "warnings.simplefilter('error')\n"
        f"try:\n    importlib.import_module('bertattn.{name}')\n"
        "except DeprecationWarning as w:\n    print('warned:', w)\n"
        "warnings.simplefilter('ignore')\n"
        f"import bertattn.runtime.{name} as new\n"
        f"print(importlib.import_module('bertattn.{name}') is new)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"warned: bertattn.{name} is deprecated: import bertattn.runtime.{name}" in out.stdout
    assert out.stdout.strip().endswith("True"), out


def test_the_package_names_still_import() -> None:
    code = (
        "import warnings\nwarnings.simplefilter('always')\n"
        "from bertattn.bert import Bert, BertModel, resolve_model\n"
        "import bertattn.encoder as e\n"
        "print(Bert is e.Bert and BertModel is e.BertModel and resolve_model is e.resolve_model)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True" and "bertattn.bert is deprecated" in out.stderr


def test_nothing_in_the_package_imports_the_old_names() -> None:
    """The library itself uses the new places: importing all of it warns of nothing moved."""
    code = (
        "import warnings\nwarnings.simplefilter('error', DeprecationWarning)\n"
        "import bertattn, bertattn.encoder, bertattn.runtime, bertattn.heads, bertattn.jobs\n"
        "import bertattn.serve, bertattn.cli, bertattn.families\n"
        "from bertattn import Bert\nprint('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr[-2000:]
