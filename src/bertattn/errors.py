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

import errno
import os

__all__ = [
    "JobError",
    "MissingExtraError",
    "ModelFolderError",
    "UsageError",
    "describe_os_error",
    "disk_full",
    "exit_status",
    "one_line",
]


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


def exit_status(exc: BaseException) -> int | None:
    """The command line's exit status for an anticipated error (2: usage, 1: run time); None
    for anything else, a bug (shown with its traceback)."""
    if isinstance(exc, UsageError):
        return 2
    if isinstance(exc, (ValueError, OSError, ImportError, JobError)):
        return 1
    return None


def describe_os_error(exc: OSError) -> str:
    """An ``OSError`` in words: its strerror and the path (no class name, no ``[Errno N]``)."""
    text = exc.strerror or " ".join(str(exc).split()) or "input/output error"
    if exc.filename is not None:
        name = os.fsdecode(exc.filename)
        if name not in text:
            text = f"{name}: {text}"
    return text


def disk_full(exc: BaseException) -> bool:
    """The error is a full disk or an exceeded quota: the fix is free space, not a rerun."""
    return isinstance(exc, OSError) and exc.errno in (
        errno.ENOSPC,
        getattr(errno, "EDQUOT", errno.ENOSPC),
    )


def one_line(exc: BaseException) -> str:
    """The error as the one line the command line prints after ``error:``."""
    if isinstance(exc, OSError):
        return describe_os_error(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ImportError) and "pip install" not in text:
        text += " (a package is missing: pip install bertattn with the extra that needs it)"
    return text
