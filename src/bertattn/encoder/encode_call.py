"""One call of :meth:`bertattn.Bert.encode`: its signature, written once, and its options,
grouped and checked.

:data:`ST_ENCODE` is sentence-transformers' ``SentenceTransformer.encode`` signature (names,
order, defaults); :data:`ENCODE` adds bertattn's keyword-only parameters. ``Bert.encode``,
``encode_query`` and ``encode_document`` show them (:func:`takes`) and read their arguments
through them (:func:`arguments`), so a new keyword is added here alone.

:class:`EncodeCall` groups a call's options as the jobs group theirs: :class:`Batching` (how
the texts are batched and the progress shown), :class:`Pooled` (pooling, normalization,
``truncate_dim``), :class:`Output` (what is returned: ``output_value``, ``precision``, NumPy or
torch) and the prompt."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, check_bool, check_int, describe
from .st_compat import OUTPUT_VALUES, PRECISIONS, quantize_embeddings

__all__ = [
    "ENCODE",
    "ST_ENCODE",
    "Batching",
    "EncodeCall",
    "Output",
    "Pooled",
    "arguments",
    "finish",
    "takes",
]

F = TypeVar("F", bound=Callable[..., Any])


def _sentence_transformers_encode(  # noqa: ANN001  (self, as the methods show it)
    self,
    inputs: str | Iterable[str],
    prompt_name: str | None = None,
    prompt: str | None = None,
    batch_size: int = 32,
    show_progress_bar: bool | None = None,
    output_value: str | None = "sentence_embedding",
    precision: str = "float32",
    convert_to_numpy: bool = True,
    convert_to_tensor: bool = False,
    device: str | torch.device | None = None,
    normalize_embeddings: bool = False,
    truncate_dim: int | None = None,
    pool: dict | None = None,
    chunk_size: int | None = None,
    **kwargs: Any,
) -> Any:
    """``SentenceTransformer.encode``'s parameters, in its order, with its defaults."""


def _bertattn_keywords(
    *,
    pooling: str | None = None,
    normalize: bool | None = None,
    max_length: int | None = None,
    progress: Callable[[int], object] | None = None,
    batch_tokens: int | None = None,
) -> None:
    """bertattn's own keywords of ``Bert.encode``."""


#: ``SentenceTransformer.encode``'s signature (``Bert.encode_query`` / ``encode_document``)
ST_ENCODE = inspect.signature(_sentence_transformers_encode)
_ST = list(ST_ENCODE.parameters.values())
#: ``Bert.encode``'s: :data:`ST_ENCODE` with bertattn's keywords before ``**kwargs``
ENCODE = ST_ENCODE.replace(
    parameters=[*_ST[:-1], *inspect.signature(_bertattn_keywords).parameters.values(), _ST[-1]]
)
#: the parameters named when an unknown keyword is refused: sentence-transformers' (less the
#: multi-process ones, which are refused anyway) and bertattn's
ST_NAMES = tuple(p for p in ST_ENCODE.parameters if p not in ("self", "inputs", "pool",
                                                            "chunk_size", "kwargs"))  # fmt: skip
BERTATTN_NAMES = tuple(inspect.signature(_bertattn_keywords).parameters)


def takes(signature: inspect.Signature) -> Callable[[F], F]:
    """Show ``signature`` as the decorated method's (``help``, ``inspect.signature``)."""

    def mark(fn: F) -> F:
        fn.__signature__ = signature  # type: ignore[attr-defined]
        return fn

    return mark


def arguments(
    signature: inspect.Signature, self: object, args: tuple, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Every parameter of ``signature`` but ``self`` -> its value in this call (defaults
    filled in; ``kwargs``: the keywords it does not name, a dict). A call it does not fit
    raises ``TypeError`` saying why."""
    try:
        bound = signature.bind(self, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"encode(): {exc}.") from None
    bound.apply_defaults()
    given = dict(bound.arguments)
    given.pop("self")
    return given


@dataclass(frozen=True)
class Batching:
    """How the texts are batched (``batch_size``, ``batch_tokens``: a batch's padded tokens at
    most, ``max_length``: tokens kept per text) and how progress is shown."""

    batch_size: int = 32
    batch_tokens: int | None = None
    max_length: int | None = None
    show_progress_bar: bool = False
    progress: Callable[[int], object] | None = None


@dataclass(frozen=True)
class Pooled:
    """How token states become a sentence embedding: ``pooling`` and ``normalize`` (None: the
    folder's), then ``truncate_dim`` and ``normalize_embeddings`` (L2, after the cut)."""

    pooling: str | None = None
    normalize: bool | None = None
    truncate_dim: int | None = None
    normalize_embeddings: bool = False


@dataclass(frozen=True)
class Output:
    """What is returned: ``value`` (sentence-transformers' ``output_value``), ``precision``
    (float32, or quantized), and as NumPy (``to_numpy``) or a torch tensor (``to_tensor``);
    neither: a list of tensors."""

    value: str | None = "sentence_embedding"
    precision: str = "float32"
    to_numpy: bool = True
    to_tensor: bool = False


@dataclass(frozen=True)
class EncodeCall:
    """One ``Bert.encode`` call's options, checked: :class:`Batching`, :class:`Pooled`,
    :class:`Output` and the prompt (resolved text, None: none)."""

    batching: Batching
    pooled: Pooled
    output: Output
    prompt: str | None = None

    def loop_keywords(self) -> dict[str, Any]:
        """The keywords of ``Bert``'s encoding loop for this call."""
        b, p, o = self.batching, self.pooled, self.output
        return {
            "pooling": p.pooling, "normalize": p.normalize, "batch_size": b.batch_size,
            "max_length": b.max_length, "progress": b.progress, "batch_tokens": b.batch_tokens,
            "prompt": self.prompt, "output_value": o.value, "to_cpu": o.to_numpy,
            "normalize_embeddings": p.normalize_embeddings, "truncate_dim": p.truncate_dim,
            "show_progress_bar": b.show_progress_bar,
        }  # fmt: skip


def progress_bar(value: object, verbose: bool) -> bool:
    """``show_progress_bar`` checked (None: ``verbose``)."""
    if value is None:
        return verbose
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(
            f"show_progress_bar must be True, False or None, got {value!r} (the 5th positional "
            f"parameter is show_progress_bar, as in sentence-transformers: pass max_length= by "
            f"keyword)."
        )
    return bool(value)


def output_of(given: dict[str, Any]) -> Output:
    """The :class:`Output` of a call's arguments (``convert_to_numpy``, ``convert_to_tensor``,
    ``output_value``, ``precision``), checked; the checks of ``normalize_embeddings`` and
    ``chunk_size`` come with them, in sentence-transformers' order."""
    check_bool(given["convert_to_numpy"], "convert_to_numpy")
    check_bool(given["convert_to_tensor"], "convert_to_tensor")
    check_bool(given["normalize_embeddings"], "normalize_embeddings")
    check_int(given["chunk_size"], "chunk_size", low=1, optional=True)
    to_tensor, to_numpy = given["convert_to_tensor"], given["convert_to_numpy"]
    value = given["output_value"]
    if value is not None and not isinstance(value, str):
        raise ArgumentTypeError(
            f"output_value must be one of {OUTPUT_VALUES}, got {describe(value)}."
        )
    if value not in OUTPUT_VALUES:
        raise ValueError(f"output_value {value!r} is not supported; use one of {OUTPUT_VALUES}.")
    if value != "sentence_embedding":
        to_tensor = to_numpy = False
    return Output(value, _precision(given["precision"], value), bool(to_numpy and not to_tensor),
                  bool(to_tensor))  # fmt: skip


def _precision(precision: object, output_value: str | None) -> str:
    """``precision`` checked (None: float32); it quantizes sentence embeddings only."""
    if precision is None:
        return "float32"
    if not isinstance(precision, str):
        got = describe(precision)
        raise ArgumentTypeError(f"precision must be one of {PRECISIONS}, got {got}.")
    if precision not in PRECISIONS:
        raise ValueError(f"Precision {precision!r} is not supported, must be one of {PRECISIONS}")
    if output_value is None and precision != "float32":
        raise ValueError(
            f"precision={precision!r} quantizes embeddings; with output_value=None (dicts of "
            f"every output) pass precision='float32', or quantize the 'sentence_embedding' "
            f"entries with bertattn.encoder.pipeline.quantize_embeddings."
        )
    return precision


def finish(out: Any, output: Output, single: bool) -> Any:
    """The loop's rows as :class:`Output` asks: quantized, as NumPy, a tensor or a list of
    tensors; the first row alone for one text (``single``)."""
    if len(out) and output.precision != "float32":
        out = quantize_embeddings(out, precision=output.precision)
    if output.to_tensor:
        out = torch.as_tensor(out)
    elif output.to_numpy:
        if isinstance(out, Tensor):
            out = out.numpy()
    elif isinstance(out, np.ndarray):
        out = list(torch.from_numpy(out))
    elif isinstance(out, Tensor):
        out = list(out)
    return out[0] if single else out
