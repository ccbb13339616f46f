"""sentence-transformers compatibility: quantization, similarity, ST config, inputs."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, is_text_pair
from ..errors import ModelFolderError
from .folder import ModelFolder
from .jsonfile import check_bool, check_int, read_json_object, show

if TYPE_CHECKING:
    from .pipeline import Bert

logger = logging.getLogger("bertattn.encoder")

__all__ = [
    "OUTPUT_VALUES",
    "PRECISIONS",
    "SIMILARITY_FN_NAMES",
    "ST_CONFIG_FILE",
    "SentenceTransformerConfig",
    "UnsupportedArgumentError",
    "quantize_embeddings",
]

#: ``precision=`` of :meth:`Bert.encode`, as sentence-transformers' ``quantize_embeddings``
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
#: ``similarity_fn_name``s, as sentence-transformers defines them
SIMILARITY_FN_NAMES = ("cosine", "dot", "euclidean", "manhattan")
#: ``output_value=`` of :meth:`Bert.encode`
OUTPUT_VALUES = ("sentence_embedding", "token_embeddings", None)
ST_CONFIG_FILE = "config_sentence_transformers.json"


class UnsupportedArgumentError(TypeError, ValueError):
    """A :meth:`Bert.encode` argument that sentence-transformers has and bertattn does not
    (multi-process pools, non-text inputs, ...). Both a TypeError (what Python raises for an
    unexpected keyword) and a ValueError (what sentence-transformers raises)."""


def quantize_embeddings(
    embeddings: Tensor | np.ndarray | list[Tensor] | list[np.ndarray],
    precision: str,
    ranges: np.ndarray | None = None,
    calibration_embeddings: np.ndarray | None = None,
) -> np.ndarray | list[np.ndarray]:
    """sentence-transformers' ``quantize_embeddings``, the same arithmetic: ``int8`` / ``uint8``
    cut each dimension's [min, max] (of ``ranges``, else of ``calibration_embeddings``, else of
    the embeddings themselves) into 256 buckets; ``binary`` / ``ubinary`` pack the signs
    (``> 0``) into bits, ``binary`` offset by -128 into int8. A list of ``(L_i, E)`` matrices
    (token embeddings) shares one calibration."""
    if isinstance(embeddings, Tensor):
        embeddings = embeddings.float().numpy(force=True)
    elif isinstance(embeddings, list):
        if not embeddings:
            return []
        if isinstance(embeddings[0], Tensor):
            embeddings = [e.float().numpy(force=True) for e in embeddings]
        if isinstance(embeddings[0], np.ndarray) and embeddings[0].ndim == 2:
            if precision.endswith("int8") and ranges is None:
                data = (
                    np.concatenate(embeddings, axis=0)
                    if calibration_embeddings is None
                    else calibration_embeddings
                )
                if len(data):
                    ranges = _quantization_ranges(data, precision, calibration_embeddings)
            return [
                quantize_embeddings(m, precision, ranges, calibration_embeddings)  # type: ignore[misc]
                for m in embeddings
            ]
        embeddings = np.array(embeddings)
    assert isinstance(embeddings, np.ndarray)
    if embeddings.dtype in (np.uint8, np.int8):
        raise ValueError("embeddings to quantize must be float, not int8 or uint8.")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not supported; use one of {PRECISIONS}.")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        dim = embeddings.shape[1]
        signed = precision in ("int8", "binary")
        width = dim if precision.endswith("int8") else (dim + 7) // 8
        if precision != "float32":
            return np.zeros((0, width), dtype=np.int8 if signed else np.uint8)
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision.endswith("int8"):
        if ranges is None:
            ranges = _quantization_ranges(embeddings, precision, calibration_embeddings)
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        q_vals = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        if precision == "uint8":
            return q_vals.astype(np.uint8)
        return (q_vals - 128).astype(np.int8)
    if precision == "binary":
        return (np.packbits(embeddings > 0, axis=-1) - 128).astype(np.int8)
    return np.packbits(embeddings > 0, axis=-1)  # ubinary


def _quantization_ranges(
    embeddings: np.ndarray, precision: str, calibration: np.ndarray | None
) -> np.ndarray:
    if calibration is None:
        if embeddings.ndim == 1 or embeddings.shape[0] == 1:
            raise ValueError(
                f"Cannot compute {precision} quantization ranges from a single embedding. "
                f"Call `quantize_embeddings` with `ranges` or `calibration_embeddings` from a "
                f"representative set of embeddings instead (or encode several texts at once)."
            )
        if embeddings.shape[0] < 100:
            logger.warning(
                "Computing %s quantization buckets based on %d embeddings. %s quantization is "
                "more stable with `ranges` calculated from more embeddings or a "
                "`calibration_embeddings` that can be used to calculate the buckets.",
                precision,
                len(embeddings),
                precision,
            )
        calibration = embeddings
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def _as_batch(a: object, *, batch: bool) -> Tensor:
    """Embeddings (tensor, numpy array, list of either, nested lists) as a float tensor, 2-D
    when ``batch`` (a 1-D vector becomes one row), as sentence-transformers converts them."""
    if isinstance(a, list) and a and all(isinstance(x, Tensor) for x in a):
        t = torch.stack(a)
    elif isinstance(a, list) and a and all(isinstance(x, np.ndarray) for x in a):
        t = torch.from_numpy(np.stack(a))
    elif isinstance(a, np.ndarray):
        t = torch.from_numpy(a) if a.flags.writeable else torch.tensor(a)
    elif isinstance(a, Tensor):
        t = a
    else:
        t = torch.tensor(a)
    if not torch.is_floating_point(t) or torch.finfo(t.dtype).bits < 32:
        t = t.to(torch.float32)
    if batch and t.dim() == 1:
        t = t.unsqueeze(0)
    return t


def similarity_matrix(name: str, a: object, b: object) -> Tensor:
    x, y = _as_batch(a, batch=True), _as_batch(b, batch=True)
    if name == "cosine":
        x, y = torch.nn.functional.normalize(x, p=2, dim=1), torch.nn.functional.normalize(y, dim=1)
        return x @ y.T
    if name == "dot":
        return x @ y.T
    return -torch.cdist(x, y, p=2.0 if name == "euclidean" else 1.0)


def pairwise_similarity(name: str, a: object, b: object) -> Tensor:
    x, y = _as_batch(a, batch=False), _as_batch(b, batch=False)
    if name == "cosine":
        x, y = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(y, dim=-1)
        return (x * y).sum(dim=-1)
    if name == "dot":
        return (x * y).sum(dim=-1)
    if name == "manhattan":
        return -torch.abs(x - y).sum(dim=-1)
    return -torch.linalg.vector_norm(x - y, dim=-1)


@dataclass
class SentenceTransformerConfig:
    """What ``config_sentence_transformers.json`` (and the Pooling config's
    ``include_prompt``) say, read as sentence-transformers reads them: ``prompts`` (always
    with ``"query"`` and ``"document"``, ``""`` unless set), ``default_prompt_name``,
    ``similarity_fn_name`` (a name outside :data:`SIMILARITY_FN_NAMES` is ignored: cosine),
    ``truncate_dim``, ``include_prompt`` (False: prompt tokens are left out of pooling)."""

    prompts: dict[str, str] = field(default_factory=lambda: {"query": "", "document": ""})
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    truncate_dim: int | None = None
    include_prompt: bool = True

    @classmethod
    def read(cls, folder: ModelFolder | None) -> SentenceTransformerConfig:
        out = cls()
        if folder is None:
            return out
        for path in folder.settings_files:  # the Pooling module's config.json
            if path.name == "config.json" and path.is_file():
                value = read_json_object(path).get("include_prompt", True)
                try:
                    check_bool("include_prompt", value)
                except ValueError as exc:
                    raise ModelFolderError(f"{path}: {exc}") from None
                out.include_prompt = bool(value)
        path = folder.root / ST_CONFIG_FILE
        if not path.is_file():
            return out
        cfg = read_json_object(path)
        prompts = cfg.get("prompts", {})
        if not isinstance(prompts, dict) or not all(
            isinstance(v, str) or v is None for v in prompts.values()
        ):
            raise ModelFolderError(
                f'{path}: prompts must be an object of strings (e.g. {{"query": "query: "}}), '
                f"got {show(prompts)}."
            )
        out.prompts.update({k: v or "" for k, v in prompts.items()})
        name = cfg.get("default_prompt_name")
        if name is not None and name not in out.prompts:
            raise ModelFolderError(
                f"{path}: default_prompt_name {show(name)} is not among the prompts "
                f"{list(out.prompts)}; name one of them, or null."
            )
        out.default_prompt_name = name
        fn = cfg.get("similarity_fn_name")
        if fn in SIMILARITY_FN_NAMES:
            out.similarity_fn_name = fn
        elif fn is not None:
            logger.warning(
                "%s: similarity_fn_name %s is not one of %s; using cosine, as "
                "sentence-transformers does.",
                path,
                show(fn),
                SIMILARITY_FN_NAMES,
            )
        try:
            check_int("truncate_dim", cfg.get("truncate_dim"), minimum=1, null=True)
        except ValueError as exc:
            raise ModelFolderError(f"{path}: {exc}") from None
        out.truncate_dim = cfg.get("truncate_dim")
        return out


def text_list(inputs: object, what: str) -> tuple[list[str], bool]:
    """``(texts, single)``: a str is one text (``single``); any other iterable of str (list,
    tuple, 1-D numpy array, pandas Series, generator) is a batch."""
    if isinstance(inputs, str):
        return [inputs], True
    if isinstance(inputs, (bytes, bytearray)):
        raise ValueError(f"{what} is bytes; decode it to str first (e.g. data.decode('utf-8')).")
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 0 and isinstance(inputs.item(), str):
            return [inputs.item()], True
        if inputs.ndim != 1:
            raise ValueError(
                f"{what} is a {inputs.ndim}-D numpy array of shape {inputs.shape}; pass a 1-D "
                f"array (or list) of str."
            )
        texts = inputs.tolist()
    elif isinstance(inputs, list):
        texts = inputs
    elif isinstance(inputs, Mapping):
        raise UnsupportedArgumentError(
            f"{what} is a {type(inputs).__name__}; bertattn embeds text only (no multimodal "
            f"dicts): pass a str or a list of str."
        )
    else:
        try:
            texts = list(inputs)  # type: ignore[call-overload]
        except TypeError:
            raise ArgumentTypeError(
                f"{what} must be a str or an iterable of str, got {type(inputs).__name__}."
            ) from None
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ArgumentTypeError(
            f"{what}[{bad}] is a {type(texts[bad]).__name__}, not a str; bertattn embeds text "
            f"only (sentence-transformers' image, audio and message inputs are not supported)."
        )
    return texts, False


def input_aliases(fn: Callable) -> Callable:
    """``encode(sentences=...)`` (sentence-transformers < 6's name) and ``encode(texts=...)``
    (bertattn's earlier name) mean ``encode(inputs=...)``, as sentence-transformers'
    deprecated-keyword shim does."""

    @functools.wraps(fn)
    def wrapper(self: Bert, *args: object, **kwargs: object) -> object:
        for old in ("sentences", "texts"):
            if old in kwargs:
                if args or "inputs" in kwargs:
                    raise TypeError(f"encode() got the texts twice: inputs and {old}=.")
                kwargs["inputs"] = kwargs.pop(old)
        return fn(self, *args, **kwargs)

    return wrapper


def text_inputs(inputs: object, what: str) -> tuple[list[str], list[str] | None, bool]:
    """``(texts, pairs, single)``: :func:`text_list`, plus text pairs as sentence-transformers
    takes them (a list of ``(a, b)`` tuples or 2-item lists, or an ``(N, 2)`` numpy array of
    str): ``texts`` the first texts, ``pairs`` the second ones (None for single texts), each
    pair cross-encoded as ``[CLS] a [SEP] b [SEP]``."""
    if isinstance(inputs, np.ndarray) and inputs.ndim == 2:
        if inputs.shape[1] != 2:
            raise ValueError(
                f"{what} is a 2-D numpy array of shape {inputs.shape}; a 2-D array holds text "
                f"pairs, one (first, second) row each: pass shape (N, 2), or a 1-D array of str."
            )
        inputs = [tuple(row) for row in inputs.tolist()]
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], (tuple, list)):
        firsts: list[str] = []
        seconds: list[str] = []
        for i, item in enumerate(inputs):
            if not is_text_pair(item):
                raise ValueError(
                    f"{what}[{i}] is {_describe(item)}; {what}[0] is a text pair, so every "
                    f"item must be a pair of two str, (first, second). Encode single texts and "
                    f"pairs in separate calls."
                )
            firsts.append(item[0])
            seconds.append(item[1])
        return firsts, seconds, False
    texts, single = text_list(inputs, what)
    return texts, None, single


def _describe(item: object) -> str:
    if isinstance(item, (tuple, list)):
        return f"a {type(item).__name__} of {len(item)} items"
    return f"a {type(item).__name__}"


def processing_max_length(processing_kwargs: object, max_length: int | None) -> int | None:
    """The token limit a ``processing_kwargs=`` argument (sentence-transformers' per-call
    tokenizer settings, ``{"text": {"max_length": 8}}``) asks for, else ``max_length``.
    bertattn's tokenizer always pads to the longest text and truncates longest-first, so
    ``padding=True`` / ``"longest"`` and ``truncation=True`` / ``"longest_first"`` change
    nothing and are accepted; any other setting is refused (it would be ignored)."""
    if processing_kwargs is None:
        return max_length
    fix = 'pass processing_kwargs={"text": {"max_length": N}}, or max_length=N'
    if not isinstance(processing_kwargs, Mapping):
        raise TypeError(
            f"processing_kwargs must be a dict such as {{'text': {{'max_length': 128}}}}, got "
            f"{type(processing_kwargs).__name__}."
        )
    other = sorted(str(k) for k in processing_kwargs if k != "text")
    if other:
        raise UnsupportedArgumentError(
            f"processing_kwargs[{other[0]!r}] is not supported: bertattn's tokenizer takes "
            f"text only, and only its max_length can change per call; {fix}."
        )
    text = processing_kwargs.get("text") or {}
    if not isinstance(text, Mapping):
        raise TypeError(
            f"processing_kwargs['text'] must be a dict such as {{'max_length': 128}}, got "
            f"{type(text).__name__}."
        )
    harmless = {"padding": (True, "longest"), "truncation": (True, "longest_first")}
    for key, value in text.items():
        if key == "max_length" or value in harmless.get(key, ()):
            continue
        raise UnsupportedArgumentError(
            f"processing_kwargs['text'][{key!r}]={value!r} is not supported: bertattn's "
            f"tokenizer pads to the longest text and truncates longest-first, and only the "
            f"max_length can change per call; {fix}."
        )
    limit = text.get("max_length", max_length)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(
            f"processing_kwargs['text']['max_length'] must be a positive int, got {limit!r}."
        )
    return limit
