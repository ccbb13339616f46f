"""A pytest plugin for running sentence-transformers' own tests: with
``BERTATTN_ST_SUBSTITUTE=1`` it puts bertattn's ``CrossEncoder``, ``SparseEncoder`` and
``MultiVectorEncoder`` in the place of sentence-transformers' (every public name the tests
import them by) when it is imported, that is before the test modules and their ``conftest.py``
import them; with ``BERTATTN_ST_REPORT=<file>`` it writes each test's outcome there as JSON
(node id -> ``{"outcome", "error"}``, ``error`` the exception's last line).

Load it with ``pytest -p upstream_st_plugin`` (``scripts/`` on ``PYTHONPATH``);
``scripts/upstream_st_tests.py`` does.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import pytest

#: bertattn class -> the sentence-transformers modules that export it under the same name
SUBSTITUTED: dict[str, tuple[str, ...]] = {
    "CrossEncoder": (
        "sentence_transformers",
        "sentence_transformers.cross_encoder",
        "sentence_transformers.cross_encoder.model",
    ),
    "SparseEncoder": (
        "sentence_transformers",
        "sentence_transformers.sparse_encoder",
        "sentence_transformers.sparse_encoder.model",
    ),
    "MultiVectorEncoder": (
        "sentence_transformers",
        "sentence_transformers.multi_vector_encoder",
        "sentence_transformers.multi_vector_encoder.model",
    ),
}


def substitute() -> dict[str, Any]:
    """Put bertattn's head classes in the place of sentence-transformers' in the modules of
    :data:`SUBSTITUTED`; returns the replaced originals (``"module.Name"`` -> class)."""
    import bertattn

    replaced = {}
    for name, modules in SUBSTITUTED.items():
        ours = getattr(bertattn, name)
        for module_name in modules:
            module = importlib.import_module(module_name)
            replaced[f"{module_name}.{name}"] = getattr(module, name, None)
            setattr(module, name, ours)
    return replaced


if os.environ.get("BERTATTN_ST_SUBSTITUTE") == "1":
    substitute()

_outcomes: dict[str, dict[str, str]] = {}


def _last_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).strip().splitlines()[0][:300] if crash.message else ""
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1][:300] if text else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep each test's outcome: a failure in setup or teardown counts as the test's."""
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "error": ""})
    if report.when == "call" and report.passed:
        return
    if report.failed and entry["outcome"] != "failed":
        entry.update(outcome="failed", error=_last_line(report))
    elif report.skipped and entry["outcome"] == "passed":
        entry.update(outcome="skipped", error=_last_line(report))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the outcomes where ``BERTATTN_ST_REPORT`` says."""
    path = os.environ.get("BERTATTN_ST_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_outcomes, f, indent=1, sort_keys=True)
