"""docs/development.md held to the tree: the layout table names every package folder and
top-level module of ``src/bertattn`` and nothing that is not there (a folder's row that lists
its modules lists them all), and each of the three checklists ("Adding an architecture", "a
head kind", "a route") is ten lines or fewer and names files, objects and tests that exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "development.md"
SRC = ROOT / "src" / "bertattn"
#: each checklist's section title -> the package its bare dotted names (``registry.register``)
#: are read in
CHECKLISTS = {
    "Adding an architecture": "bertattn.families",
    "Adding a head kind": "bertattn.heads",
    "Adding a route": "bertattn.serve",
}


def _section(title: str) -> str:
    """The text of the ``## title`` section of the page, up to the next ``## `` heading."""
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/development.md has no section '## {title}'"
    return match.group(1)


def _layout_rows() -> list[tuple[list[str], str]]:
    """The layout table's rows: the names in backticks of the first cell (``runtime/``,
    ``errors.py``) and the second cell."""
    rows = []
    for line in _section("Layout").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[0] not in ("room", "---"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    assert len(rows) >= 10, f"docs/development.md's layout table has {len(rows)} rows"
    return rows


def _named(suffix: str) -> set[str]:
    return {name for names, _ in _layout_rows() for name in names if name.endswith(suffix)}


def _differences(named: set[str], tree: set[str]) -> str:
    return (
        f"in the tree, not in docs/development.md's layout: {sorted(tree - named)}; "
        f"on the page, not in src/bertattn: {sorted(named - tree)}"
    )


def test_the_layout_names_every_package_folder_and_no_other() -> None:
    tree = {p.name + "/" for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    named = _named("/")
    assert named == tree, _differences(named, tree)


def test_the_layout_names_every_top_level_module_and_no_other() -> None:
    tree = {p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    named = _named(".py")
    assert named == tree, _differences(named, tree)


def test_a_folder_row_that_lists_modules_lists_them_all() -> None:
    """A row of one folder names only modules of that folder (``cpu.py``), and when it names
    more than one (a list, not an example) it names them all."""
    checked = 0
    for names, text in _layout_rows():
        if len(names) != 1 or not names[0].endswith("/"):
            continue
        named = set(re.findall(r"`(\w+\.py)`", text))
        if named:
            folder = SRC / names[0]
            tree = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
            assert named <= tree, _differences(named, tree)
            if len(named) > 1:
                assert named == tree, _differences(named, tree)
            checked += 1
    assert checked >= 2  # runtime/ lists its modules, families/ names one


def _checklist(title: str) -> tuple[str, list[str]]:
    """The section's text and the lines of its numbered list (``1.`` to the list's end)."""
    text = _section(title)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("1. "))
    end = next((i for i in range(first, len(lines)) if not lines[i].strip()), len(lines))
    return text, lines[first:end]


def _resolves(dotted: str, package: str) -> bool | None:
    """Whether ``dotted`` (``registry.register``, ``bertattn.heads.registry.HeadKind``,
    ``Bert.forward_encodings``) names an object of bertattn; None when its first part is no
    module of ``package`` or of bertattn and no public name of bertattn (a variable such as
    ``probe.head``)."""
    import bertattn

    head, *rest = dotted.split(".")
    if head == "bertattn":
        base, parts = "bertattn", rest
    elif (SRC / package.split(".")[1] / f"{head}.py").is_file():
        base, parts = package, [head, *rest]
    elif (SRC / f"{head}.py").is_file() or (SRC / head).is_dir() or hasattr(bertattn, head):
        base, parts = "bertattn", [head, *rest]
    else:
        return None
    for cut in range(len(parts), -1, -1):
        try:
            obj = importlib.import_module(".".join([base, *parts[:cut]]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("title", CHECKLISTS)
def test_each_checklist_is_ten_lines_or_fewer(title: str) -> None:
    _, steps = _checklist(title)
    assert 3 <= len(steps) <= 10, f"'{title}' is {len(steps)} lines long: {steps}"


@pytest.mark.parametrize("title", CHECKLISTS)
def test_each_checklist_names_files_objects_and_tests_that_exist(title: str) -> None:
    """Paths (from the repository or from ``src/bertattn``), dotted names of the library and
    ``test_*`` functions of tests/, each in backticks; the tests that prove a checklist
    include one in the test module the section names."""
    text, _ = _checklist(title)
    quoted = re.findall(r"`([^`]+)`", text)
    paths = [q for q in quoted if re.fullmatch(r"[\w.]+(/[\w.]*)+", q)]
    missing = [p for p in paths if not ((ROOT / p).exists() or (SRC / p).exists())]
    assert not missing, f"'{title}' names files that do not exist: {missing}"
    dotted = [q for q in quoted if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", q) and "/" not in q]
    dotted = [d for d in dotted if not re.fullmatch(r"[\w/]+\.(py|json|md)", d)]
    broken = [d for d in dotted if _resolves(d, CHECKLISTS[title]) is False]
    assert not broken, f"'{title}' names objects bertattn does not have: {broken}"
    tests = [q for q in quoted if re.fullmatch(r"test_\w+", q)]
    modules = [p for p in paths if p.startswith("tests/test_")]
    assert tests and modules, f"'{title}' names no test (or no test module) that proves it"
    sources = "".join((ROOT / m).read_text(encoding="utf-8") for m in modules)
    undefined = [t for t in tests if f"def {t}(" not in sources]
    assert not undefined, f"'{title}' names tests that {modules} do not define: {undefined}"
