"""Reading a model folder's JSON files, and checking the values read from them.

A leaf of ``bertattn.encoder`` (imports only :mod:`bertattn.errors`), shared by the config, the
tokenizer and the folder resolver so every file is read, and every value checked, one way:

* :func:`read_json` / :func:`read_json_object`: a missing, unreadable, non-UTF-8 or malformed
  file raises :class:`~bertattn.errors.ModelFolderError` naming the file and the fix.
* ``check_*``: a value of the wrong JSON type or out of range raises ``ValueError`` whose
  message starts with the field name; the caller prefixes the file (or ``BertConfig``).

Numbers are strict: an integer field takes a JSON integer only (``384``, not ``384.0``,
``"384"`` or ``true``); a real field takes an integer or a fraction, never ``NaN`` / ``Infinity``
(which Python's ``json`` accepts) and never a boolean.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..errors import ModelFolderError, UsageError

__all__ = [
    "ModelFolderNotFoundError",
    "check_bool",
    "check_int",
    "check_real",
    "ModelPathNotFoundError",
    "check_str",
    "json_type",
    "read_json",
    "read_json_object",
    "show",
]


class ModelFolderNotFoundError(ModelFolderError, FileNotFoundError):
    """A model folder, or a file it needs, does not exist. Both a :class:`ModelFolderError`
    (a ``ValueError``) and a ``FileNotFoundError``, so either ``except`` catches it."""


class ModelPathNotFoundError(ModelFolderNotFoundError, UsageError):
    """The model path given is neither a folder nor a hub name: a mistyped argument, which the
    command line reports as a usage error (exit 2), like a missing input file. (A folder that
    exists but lacks a file it needs stays a :class:`ModelFolderNotFoundError`: exit 1.)"""


def json_type(value: object) -> str:
    """The JSON name of a Python value's type (``"string"``, ``"boolean"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number" if math.isfinite(value) else "non-finite number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def show(value: object) -> str:
    """A value as it is written in JSON (``"384"``, ``true``, ``NaN``), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; ModelFolderError naming the file for a file that is
    missing, unreadable, not UTF-8 or not JSON."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ModelFolderNotFoundError(f"{path} does not exist.") from None
    except OSError as exc:
        raise ModelFolderError(f"{path}: cannot read it ({exc.strerror or exc}).") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFolderError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); JSON files must be "
            f"UTF-8: re-save it as UTF-8 or download it again."
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFolderError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            f"fix the file or download it again."
        ) from None


def read_json_object(path: str | Path) -> dict[str, Any]:
    """:func:`read_json`, and the value must be a JSON object (``{...}``)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ModelFolderError(
            f"{path}: expected a JSON object ({{...}}), got a JSON {json_type(data)}; fix the "
            f"file or download it again."
        )
    return data


# ---------------------------------------------------------------------- values
def _got(value: object) -> str:
    return f"got {show(value)} (a JSON {json_type(value)})"


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    null: bool = False,
    hint: str = "",
) -> None:
    """``value`` is an int (not a bool, not a float such as ``384.0``) in
    ``[minimum, maximum]``, or None when ``null``; else ValueError starting with ``name``."""
    if value is None and null:
        return
    rng = ""
    if minimum is not None and maximum is not None:
        rng = f" in [{minimum}, {maximum}]"
    elif minimum is not None:
        rng = f" >= {minimum}"
    elif maximum is not None:
        rng = f" <= {maximum}"
    what = f"an integer{rng}{' or null' if null else ''}"
    fix = hint or "write a JSON integer such as 384 (no quotes, no decimal point)"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be {what}, {_got(value)}; {fix}.")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {what}, got {value}; {fix}.")


def check_real(
    name: str,
    value: object,
    *,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = True,
    hint: str = "",
) -> None:
    """``value`` is a finite int or float (not a bool, not NaN / Infinity) within the bounds;
    else ValueError starting with ``name``."""
    if high is not None:
        lo = f"{'(' if low_open else '['}{low:g}"
        what = f"in {lo}, {high:g}{')' if high_open else ']'} (a finite number)"
    else:
        what = f"{'>' if low_open else '>='} {low:g} (a finite number)"
    fix = f"; {hint}" if hint else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be {what}, {_got(value)}{fix}.")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        v = math.inf
    if not math.isfinite(v):
        raise ValueError(f"{name} must be {what}, got {show(value)}{fix}.")
    bad_low = v <= low if low_open else v < low
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        raise ValueError(f"{name} must be {what}, got {show(value)}{fix}.")


def check_bool(name: str, value: object, *, null: bool = False) -> None:
    """``value`` is a JSON boolean (``true`` / ``false``; not ``"true"``, not 1)."""
    if value is None and null:
        return
    if not isinstance(value, bool):
        raise ValueError(
            f"{name} must be true or false{' or null' if null else ''}, {_got(value)}; "
            f"write true or false without quotes."
        )


def check_str(name: str, value: object, *, choices: tuple[str, ...] = ()) -> None:
    """``value`` is a string (one of ``choices`` when given)."""
    if not isinstance(value, str):
        fix = f"; write one of: {', '.join(choices)}" if choices else ""
        raise ValueError(f"{name} must be a string, {_got(value)}{fix}.")
    if choices and value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; supported: {', '.join(choices)}.")
