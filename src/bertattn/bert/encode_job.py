"""The file-level encode job: read texts, embed them, write the embeddings atomically.

Small separate pieces (:func:`read_texts`, :func:`write_embeddings_atomic`) so a distributed
version can reuse the reading and writing around its own encoding loop.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

__all__ = [
    "EncodeSummary",
    "encode_file",
    "read_texts",
    "write_embeddings_atomic",
    "OUTPUT_FORMATS",
]

OUTPUT_FORMATS = (".npy", ".jsonl")
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


def _lines(stream: BinaryIO, name: str) -> list[str]:
    """Decode each line as UTF-8; an invalid line -> ValueError with its number."""
    out = []
    for n, raw in enumerate(stream.read().split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{name}: line {n}: invalid UTF-8 ({exc.reason} at byte {exc.start} of the "
                f"line); convert the file to UTF-8 first."
            ) from None
    if out and out[-1] == "":  # the newline that ends the last line does not start a new one
        out.pop()
    return out


def _jsonl_texts(lines: list[str], name: str, field: str) -> list[str]:
    texts = []
    for n, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: line {n}: not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict) or field not in obj:
            keys = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(
                f"{name}: line {n}: no field {field!r} (found: {keys}); choose it with --field."
            )
        if not isinstance(obj[field], str):
            raise ValueError(
                f"{name}: line {n}: field {field!r} is a {type(obj[field]).__name__}, not a string."
            )
        texts.append(obj[field])
    return texts


def read_texts(source: str | Path, *, field: str | None = None) -> list[str]:
    """One text per line of a UTF-8 file (``"-"``: stdin). A ``.jsonl`` file, or any input
    when ``field`` is given, is read as JSON lines and ``field`` (default ``"text"``) taken."""
    name = "<stdin>" if str(source) == "-" else str(source)
    if str(source) == "-":
        lines = _lines(sys.stdin.buffer, name)
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"input file {path} does not exist.")
        with path.open("rb") as f:
            lines = _lines(f, name)
    if field is not None or Path(name).suffix.lower() in _JSONL_SUFFIXES:
        return _jsonl_texts(lines, name, field or "text")
    return lines


def _write_npy(f: BinaryIO, emb: np.ndarray) -> None:
    np.save(f, emb, allow_pickle=False)


def _write_jsonl(f: BinaryIO, emb: np.ndarray) -> None:
    for i, row in enumerate(emb):
        values = ", ".join(str(v) for v in row)  # float32 shortest round-trip repr
        f.write(f'{{"index": {i}, "embedding": [{values}]}}\n'.encode())


def check_output_path(output: str | Path) -> Path:
    out = Path(output)
    if out.suffix.lower() not in OUTPUT_FORMATS:
        raise ValueError(
            f"output {out} must end in {' or '.join(OUTPUT_FORMATS)} (the format is taken from "
            f"the suffix)."
        )
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output folder {out.parent} does not exist.")
    return out


def write_embeddings_atomic(output: str | Path, embeddings: np.ndarray) -> Path:
    """Write ``(N, E)`` float32 embeddings as ``.npy`` or ``.jsonl`` (one object per row,
    ``{"index", "embedding"}``) through a temporary file in the same folder, then
    ``os.replace`` it: ``output`` is either complete or absent."""
    out = check_output_path(output)
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be 2-D (N, E), got shape {emb.shape}.")
    writer = _write_npy if out.suffix.lower() == ".npy" else _write_jsonl
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f, emb)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:  # KeyboardInterrupt / SystemExit too: never leave the temp file
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


@dataclass
class EncodeSummary:
    """What :func:`encode_file` did, for the final report line."""

    output: Path
    texts: int
    empty: int
    truncated: int
    max_length: int
    width: int
    seconds: float

    def __str__(self) -> str:
        rate = self.texts / self.seconds if self.seconds > 0 else float("inf")
        return (
            f"{self.texts} texts ({self.empty} empty, {self.truncated} truncated to "
            f"{self.max_length} tokens) -> {self.output} ({self.texts} x {self.width} float32) "
            f"in {self.seconds:.1f}s, {rate:.1f} texts/s"
        )


def encode_file(
    input: str | Path,
    output: str | Path,
    *,
    model: str | Path | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    field: str | None = None,
    progress: Callable[[int], Callable[[int], object]] | None = None,
    dtype: str | None = None,
    onnx: str | Path | None = None,
) -> EncodeSummary:
    """Embed every line of ``input`` into ``output`` (see :func:`read_texts` and
    :func:`write_embeddings_atomic`). ``progress(total)`` returns the per-batch callback.
    ``onnx``: an exported model file to run in ONNX Runtime instead of PyTorch (``model`` is
    then the folder it was exported from: tokenizer, pooling, normalization)."""
    from .pipeline import Bert

    check_output_path(output)  # fail before the model loads
    texts = read_texts(input, field=field)
    if onnx is None:
        bert = Bert.load(model, dtype=dtype)
    else:
        from ..deploy.onnx_runtime import load_onnx_bert

        bert = load_onnx_bert(onnx, model)
    start = time.perf_counter()
    callback = None if progress is None else progress(len(texts))
    emb, stats = bert.encode_with_stats(
        texts, pooling, normalize, batch_size, max_length, progress=callback
    )
    out = write_embeddings_atomic(output, emb)
    return EncodeSummary(
        out,
        stats.texts,
        stats.empty,
        stats.truncated,
        bert.max_length if max_length is None else max_length,
        emb.shape[1],
        time.perf_counter() - start,
    )
