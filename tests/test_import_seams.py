"""The import seams of the server and the jobs: no module of ``bertattn.serve`` or
``bertattn.jobs`` imports another's private names (a leading underscore), and their runtime
imports form no cycle (``serve/app.py`` and ``serve/head_routes.py`` share
``serve/handling.py``; ``jobs/encode.py`` and ``jobs/heads.py`` share ``jobs/summary.py``).
Imports under ``if TYPE_CHECKING:`` are for annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertattn"


def _runtime_imports(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each ``from .x import a, b`` in ``path`` outside
    ``if TYPE_CHECKING:``, the module resolved within ``bertattn``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in skip:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*parts, node.module] if node.module else parts)
            out.append((module, [a.name for a in node.names]))
    return out


def _modules(sub: str) -> dict[str, Path]:
    return {f"bertattn.{sub}.{p.stem}": p for p in (SRC / sub).glob("*.py")}


@pytest.mark.parametrize("sub", ["serve", "jobs"])
def test_no_module_imports_anothers_private_names(sub):
    bad = []
    for name, path in _modules(sub).items():
        for module, names in _runtime_imports(path, f"bertattn.{sub}"):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            bad += [f"{name} imports {module}.{n}" for n in private]
    assert not bad, bad


@pytest.mark.parametrize("sub", ["serve", "jobs"])
def test_runtime_imports_form_no_cycle(sub):
    mods = _modules(sub)
    graph = {
        name: {m for m, _ in _runtime_imports(path, f"bertattn.{sub}") if m in mods and m != name}
        for name, path in mods.items()
        if not name.endswith("__init__")
    }

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, start]
                if nxt not in trail:
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for name in graph if (c := cycle_from(name))]
    assert not cycles, cycles[0]
