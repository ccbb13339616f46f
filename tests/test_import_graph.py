"""The house's import graph, read from the source (every ``from ... import`` and ``import``,
those under ``if TYPE_CHECKING:`` included: an annotation is a dependency too).

* No file imports another file's private names (a leading underscore).
* The folders (rooms) import each other in no circle: ``encoder/`` may import ``families/``, or
  ``families/`` ``encoder/``, never both.
* ``attention/`` and ``blocks/`` stand low: they import only each other downwards and the leaves
  every room may read (``runtime/``, the top-level helper modules), never a room above them.

The old names kept for one release (``bert/``, ``threads.py``, ``cpu.py``, ``openmp.py``,
``_moved.py``) and the package's face (``__init__.py``) re-export, so they are left out."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "bertattn"
SHIMS = {"bert", "threads", "cpu", "openmp", "_moved"}
#: what attention/ and blocks/ may import besides themselves
LOW = {"attention": {"runtime"}, "blocks": {"attention", "runtime"}}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str | None:
    """The folder (or top-level module) ``module`` lives in; None: the package's face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import of ``bertattn`` in ``path``, relative ones resolved."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "bertattn":  # from bertattn import x: x is a room or a name of the face
                out += [(f"bertattn.{a.name}", []) for a in node.names if (PKG / a.name).exists()]
            elif target.startswith("bertattn."):
                out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("bertattn.")]
    return out


def _files() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if _room(_module(p)) not in SHIMS | {None}]


def _room_graph() -> dict[str, dict[str, str]]:
    """room -> {room it imports: one file -> module that shows it}."""
    graph: dict[str, dict[str, str]] = {}
    for path in _files():
        here = _room(_module(path))
        for target, _ in _imports(path):
            there = _room(target)
            if there not in (None, here) and there not in SHIMS:
                graph.setdefault(here, {}).setdefault(there, f"{_module(path)} -> {target}")
    return graph


def test_no_file_imports_anothers_private_names():
    bad = []
    for path in _files():
        for target, names in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            bad += [f"{_module(path)} imports {target}.{n}" for n in private]
    assert not bad, bad


def test_the_rooms_import_each_other_in_no_circle():
    graph = _room_graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            for nxt in graph.get(room, {}):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    circles = [
        f"{a} -> {b} ({graph[a][b]}) and back"
        for a in graph
        for b in graph[a]
        if reaches(b, a)
    ]
    assert not circles, circles


def test_attention_and_blocks_import_nothing_above_them():
    graph = _room_graph()
    leaves = {p.stem for p in PKG.glob("*.py")} - SHIMS - {"__init__", "__main__", "demo"}
    bad = [
        f"{low} imports {room} ({graph[low][room]})"
        for low, allowed in LOW.items()
        for room in graph.get(low, {})
        if room not in allowed | leaves
    ]
    assert not bad, bad
