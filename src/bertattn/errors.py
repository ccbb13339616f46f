"""The exceptions bertattn raises on purpose, and what the command line makes of them.

A leaf: imports nothing of the package, so every layer can raise these.

* :class:`UsageError` (a ``ValueError``): the options asked for something impossible (a range,
  a combination, a path that cannot be an output). The command exits 2, like a parse error.
* :class:`MissingExtraError` (an ``ImportError``): an optional dependency is not installed; the
  message names the ``pip install`` that fixes it. Exit 1.
* :class:`ModelFolderError` (a ``ValueError``): a model folder's file is missing or malformed;
  the message names the file and the field. Exit 1.
* :class:`JobError` (a ``RuntimeError``): a job failed at run time for a reason it can explain
  (a rank died, a chunk failed). Exit 1.
Any other ``ValueError`` / ``OSError`` that reaches the command line is also reported in one line
(exit 1); anything else is a bug and shows its traceback.
"""

from __future__ import annotations

__all__ = ["JobError", "MissingExtraError", "ModelFolderError", "UsageError"]


class UsageError(ValueError):
    """Options that cannot work together or are out of range: the fix is a different command."""


class ModelFolderError(ValueError):
    """A model folder (``config.json``, ``modules.json``, pooling config, tokenizer, weights)
    that is missing, malformed or inconsistent; the message names the file and the field."""


class JobError(RuntimeError):
    """A job stopped at run time for a reason it can name (exit status 1)."""


class MissingExtraError(ImportError):
    """An optional dependency is missing; ``extra`` is the ``bertattn[...]`` extra that has it."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        self.extra = extra
        super().__init__(
            f"{what} needs the Python package {module!r}, which is not installed: "
            f"pip install 'bertattn[{extra}]'",
            name=module,
        )
