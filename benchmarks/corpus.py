"""A real, deterministic text corpus: first paragraphs of the Python standard library's docstrings.

Read with ``ast`` from the source files (nothing is imported or executed), files in sorted order,
module / class / function docstrings in source order; the first paragraph of each, whitespace
collapsed, 20-600 characters, duplicates dropped; the first ``n`` are kept. The same Python
version gives the same corpus.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path


def _docstrings(tree: ast.AST):  # type: ignore[no-untyped-def]
    nodes = [
        tree,
        *(
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ),
    ]
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
        if doc:
            yield doc


def _stdlib_docstrings():  # type: ignore[no-untyped-def]
    """Every docstring of the running Python's standard library, files in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "site-packages" in path.parts or "test" in path.parts[len(root.parts) :]:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield from _docstrings(tree)


def _collect(n: int, texts_of, low: int, high: int) -> list[str]:  # type: ignore[no-untyped-def]
    seen: set[str] = set()
    texts: list[str] = []
    for doc in _stdlib_docstrings():
        text = texts_of(doc)
        if low <= len(text) <= high and text not in seen:
            seen.add(text)
            texts.append(text)
            if len(texts) == n:
                break
    return texts


def stdlib_docstring_corpus(n: int = 1000) -> list[str]:
    """``n`` first paragraphs of docstrings of the running Python's standard library."""
    return _collect(n, lambda doc: " ".join(doc.split("\n\n")[0].split()), 20, 600)


def stdlib_paragraph_corpus(n: int = 200) -> list[str]:
    """``n`` whole docstrings of 800-3000 characters, whitespace collapsed: passages of
    ~200-700 tokens (the encoders truncate them at their max length)."""
    return _collect(n, lambda doc: " ".join(doc.split()), 800, 3000)


if __name__ == "__main__":
    import sys

    for line in stdlib_docstring_corpus(int(sys.argv[1]) if len(sys.argv) > 1 else 1000):
        print(line)
