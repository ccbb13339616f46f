"""Checks for the arguments of the Python API, made where a call comes in.

The command line's options are checked when their dataclass is built
(``bertattn.jobs.*_options``); these helpers do the same for the functions and methods a
program calls: ``Bert``, ``BertModel``, ``attention_steps``, ``open_embeddings``,
``MultiHeadAttention``. A refusal names the argument, the value that came and what is valid:

* a value of the wrong type raises :class:`ArgumentTypeError`: a ``TypeError``, and also a
  ``ValueError`` so that callers who caught the ``ValueError`` bertattn raised for these before
  still catch it;
* a value of the right type out of its range raises ``ValueError``.

An integer argument takes a Python ``int`` or a NumPy integer scalar (``np.int64(2)``), never a
bool, a float (``2.0``) or a string (``"2"``): those are type errors, not values out of range.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "ArgumentTypeError",
    "check_bool",
    "check_choice",
    "check_embedding_pair",
    "check_embeddings",
    "check_id_range",
    "check_int",
    "check_str",
    "check_tensor",
    "describe",
    "is_int",
    "is_text_pair",
    "split_pairs",
    "values_checkable",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type. A ``TypeError``, as Python raises for one, and a
    ``ValueError``, which bertattn raised for these before: ``except`` either catches it."""


def is_text_pair(item: object) -> bool:
    """Whether ``item`` is a text pair as sentence-transformers and FlagEmbedding take one: a
    tuple or list of two str ``(first, second)``."""
    return (
        isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, str) for t in item)
    )


def split_pairs(
    items: Iterable[object],
    refuse: Callable[[int, object], Exception],
    *,
    one_text_lists: bool = False,
) -> tuple[list[str], list[str | None]]:
    """``items`` (texts and text pairs) as ``(first texts, second texts)``, a second text None
    for a single text; ``one_text_lists``: a list or tuple of one str is a single text too.
    Raises ``refuse(i, item)`` for the first item ``i`` that is none of these."""
    firsts: list[str] = []
    seconds: list[str | None] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            firsts.append(item)
            seconds.append(None)
        elif is_text_pair(item) or (
            one_text_lists
            and isinstance(item, (list, tuple))
            and len(item) == 1
            and isinstance(item[0], str)
        ):
            firsts.append(item[0])  # type: ignore[index]
            seconds.append(item[1] if len(item) == 2 else None)  # type: ignore[arg-type, index]
        else:
            raise refuse(i, item)
    return firsts, seconds


def describe(value: object, limit: int = 60) -> str:
    """``value`` for a message: its repr (cut to ``limit`` characters) and its type."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    kind = _type_name(value)
    return f"{text} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"


def _type_name(value: object) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__name__ if module == "builtins" else f"{module.split('.')[0]}.{kind.__name__}"


def is_int(value: object) -> bool:
    """An ``int`` or a NumPy integer scalar, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_text(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" in {low}..{high}"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def check_int(
    value: object,
    name: str,
    *,
    low: int | None = None,
    high: int | None = None,
    optional: bool = False,
    why: str = "",
) -> int | None:
    """``value`` as a Python int in ``low..high`` (both included; None: no bound). None is
    returned as is when ``optional``. ``why`` is added to the out-of-range message (what the
    range is)."""
    if value is None and optional:
        return None
    valid = f"an int{_range_text(low, high)}" + (" or None" if optional else "")
    if not is_int(value):
        hint = ""
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
            hint = f"; pass {name}={int(value)}, not a string"
        elif isinstance(value, float) and value.is_integer():
            hint = f"; pass {name}={int(value)}, not a float"
        raise ArgumentTypeError(f"{name} must be {valid}, got {describe(value)}{hint}.")
    number = int(value)  # type: ignore[call-overload]
    if (low is not None and number < low) or (high is not None and number > high):
        extra = f" ({why})" if why else ""
        raise ValueError(f"{name}={number} is out of range: {name} must be {valid}{extra}.")
    return number


def check_bool(value: object, name: str, *, optional: bool = False) -> bool | None:
    """``value`` (a bool or a NumPy bool) as a bool; None as is when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, (bool, np.bool_)):
        valid = "True, False or None" if optional else "True or False"
        raise ArgumentTypeError(f"{name} must be {valid}, got {describe(value)}.")
    return bool(value)


def check_str(value: object, name: str, *, optional: bool = False) -> str | None:
    """``value`` if it is a str (None as is when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        valid = "a str or None" if optional else "a str"
        raise ArgumentTypeError(f"{name} must be {valid}, got {describe(value)}.")
    return value


def check_choice(
    value: object, name: str, choices: Collection[str], *, optional: bool = False
) -> str | None:
    """``value`` if it is one of ``choices`` (None as is when ``optional``)."""
    if value is None and optional:
        return None
    listed = ", ".join(repr(c) for c in choices) + (" or None" if optional else "")
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be one of {listed}, got {describe(value)}.")
    if value not in choices:
        raise ValueError(f"{name} {value!r} is not supported; use one of {listed}.")
    return value


def check_tensor(
    value: object, name: str, *, optional: bool = False, integer: bool = False
) -> torch.Tensor | None:
    """``value`` if it is a ``torch.Tensor`` (of int64 or int32, what an embedding lookup
    takes, when ``integer``); None as is when ``optional``."""
    import torch

    if value is None and optional:
        return None
    if not isinstance(value, torch.Tensor):
        valid = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise ArgumentTypeError(f"{name} must be {valid}, got {describe(value)}.")
    if integer and value.dtype not in (torch.int64, torch.int32):
        got = str(value.dtype).replace("torch.", "")
        raise ArgumentTypeError(
            f"{name} must hold integer token ids (int64 or int32), got {got}; pass {name}.long()."
        )
    return value


def values_checkable(t: torch.Tensor) -> bool:
    """Whether a check may read ``t``'s values: it is on the CPU (reading a CUDA tensor back
    would make the host wait for the device on every call; there a bad id still fails, in the
    embedding kernel's device-side assert), and nothing traces or records the call
    (``torch.compile``, ``torch.jit`` tracing, a CUDA graph capture: these must not branch on
    values)."""
    import torch

    from .capture import is_capturing

    return (
        t.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not is_capturing(t.device)
    )


def check_id_range(t: torch.Tensor, name: str, count: int, what: str) -> None:
    """Every value of the integer tensor ``t`` in ``0..count - 1`` (one min/max reduction);
    ``what`` says where ``count`` comes from (e.g. ``"config.vocab_size=99"``). Skipped where
    :func:`values_checkable` says no."""
    import torch

    if t.numel() == 0 or not values_checkable(t):
        return
    low, high = (int(v) for v in torch.aminmax(t))
    if low < 0 or high >= count:
        bad = low if low < 0 else high
        raise ValueError(
            f"{name} holds {bad}, out of range: valid values are 0..{count - 1} ({what})."
        )


def check_embeddings(value: object, name: str) -> torch.Tensor:
    """Embeddings given to a similarity: a tensor, a NumPy array, or a list of numbers, of
    vectors, of tensors or of arrays, 1-D (one vector) or 2-D (rows) -> a float tensor (at
    least float32; float64 stays float64)."""
    import torch

    forms = "a tensor, a NumPy array or a list of vectors, 1-D (one vector) or 2-D (rows)"
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (list, tuple, np.ndarray)) and not isinstance(value, str):
        items = list(value) if isinstance(value, (list, tuple)) else None
        if items and all(isinstance(x, torch.Tensor) for x in items):
            shapes = {tuple(x.shape) for x in items}
            if len(shapes) > 1:
                raise ValueError(
                    f"{name} is a list of tensors of different shapes {sorted(shapes)}; "
                    f"give vectors of one width."
                )
            t = torch.stack(items)
        else:
            try:
                arr = np.asarray(value)
            except ValueError:  # ragged nested lists
                raise ValueError(
                    f"{name} is a ragged list (rows of different lengths); give {forms} of "
                    f"one width."
                ) from None
            if arr.dtype.kind not in "iuf":
                raise ArgumentTypeError(
                    f"{name} must hold numbers ({forms}), got {describe(value)} holding "
                    f"{arr.dtype.name if arr.dtype.kind != 'O' else 'objects'}."
                )
            t = torch.from_numpy(np.array(arr))  # a writable copy
    else:
        raise ArgumentTypeError(f"{name} must be {forms}, got {describe(value)}.")
    if t.dtype == torch.bool or t.is_complex():
        got = str(t.dtype).replace("torch.", "")
        raise ArgumentTypeError(f"{name} must hold real numbers, got dtype {got}.")
    if t.dim() not in (1, 2):
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected (rows, width) or one (width,) vector."
        )
    if not t.is_floating_point() or torch.finfo(t.dtype).bits < 32:
        t = t.to(torch.float32)
    return t


def check_embedding_pair(
    a: object, b: object, names: tuple[str, str] = ("embeddings1", "embeddings2"), *, rows: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides of a similarity, checked (:func:`check_embeddings`) and made alike: one width,
    one device, one dtype (the wider). ``rows``: pairwise scores, so both give the same number
    of rows (or one of them a single vector)."""
    import torch

    x, y = check_embeddings(a, names[0]), check_embeddings(b, names[1])
    shapes = f"{names[0]} has shape {tuple(x.shape)}, {names[1]} {tuple(y.shape)}"
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"{shapes}: their widths differ; compare embeddings of one model.")
    if rows and x.dim() == y.dim() == 2 and x.shape[0] != y.shape[0]:
        raise ValueError(f"{shapes}: pairwise scores need the same number of rows.")
    if x.device != y.device:
        raise ValueError(f"{names[0]} is on {x.device}, {names[1]} on {y.device}; move one.")
    dtype = torch.promote_types(x.dtype, y.dtype)
    return x.to(dtype), y.to(dtype)
