"""The output of the embedding jobs (encode, late chunks): ``(N, E)`` float32 rows as
``.npy`` or JSON lines, written whole or not at all (:mod:`bertattn.files`), or to stdout."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ..files import write_atomic, write_stdout

if TYPE_CHECKING:
    from ..corpus.embeddings import Embeddings

__all__ = ["embeddings_payload", "write_output"]


def embeddings_payload(
    output: str | Path,
    embeddings: np.ndarray | Embeddings,
    ids: Sequence[object] | None = None,
) -> Callable[[BinaryIO], None]:
    """A writer of ``(N, E)`` float32 embeddings (an array, or the shards of a chunked run) in
    the format of ``output``'s suffix: ``.npy`` (the standard format, written shard by shard),
    or JSON lines (``.jsonl`` and ``-``, stdout): one ``{"index", "id" (with ``ids``),
    "embedding"}`` object a line, written by the json module; each number is the shortest
    decimal that reads back as the same float32."""
    from ..corpus.embeddings import npy_header

    if isinstance(embeddings, np.ndarray):
        if embeddings.ndim != 2:
            raise ValueError(f"embeddings must be 2-D (N, E), got shape {embeddings.shape}.")
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        shards: Callable[[], object] = lambda: [(0, emb)]  # noqa: E731
    else:
        emb = embeddings  # type: ignore[assignment]
        shards = embeddings.shards
    rows, width = emb.shape
    if ids is not None and len(ids) != rows:
        raise ValueError(f"{len(ids)} ids for {rows} embeddings.")
    if str(output) != "-" and Path(output).suffix.lower() == ".npy":

        def npy(f: BinaryIO) -> None:
            f.write(npy_header(rows, width))
            for _, part in shards():  # type: ignore[attr-defined]
                f.write(np.ascontiguousarray(part, dtype=np.float32).tobytes())

        return npy
    for start, part in shards():  # type: ignore[attr-defined]
        bad = np.flatnonzero(~np.isfinite(part).all(axis=1))
        if bad.size:
            raise ValueError(
                f"embedding {start + int(bad[0])} holds NaN or infinity; JSON cannot hold it: "
                f"check the model folder, or write .npy."
            )

    def jsonl(f: BinaryIO) -> None:
        for start, part in shards():  # type: ignore[attr-defined]
            for j, row in enumerate(part):
                i = start + j
                record: dict[str, object] = {"index": i}
                if ids is not None:
                    record["id"] = ids[i]
                record["embedding"] = [float(str(v)) for v in row]  # float32's shortest repr
                f.write(json.dumps(record, allow_nan=False).encode() + b"\n")

    return jsonl


def write_output(out: Path | None, payload: Callable[[BinaryIO], None]) -> None:
    """To the output file atomically, or to stdout (``out`` None)."""
    if out is not None:
        write_atomic(out, payload)
        return
    write_stdout(payload)
