"""``bertattn encode --late-chunks``: late chunking on JSON lines.

Each record is ``{"text": ..., "spans": [[start, end], ...]}`` (``--field`` names the text's
field); each span gives one row, pooled from one forward of the whole text
(:meth:`bertattn.Bert.encode_late_chunks`; a text longer than ``--max-length`` runs as
overlapping windows). The rows come out in input order, record by record and span by span:
``.npy`` ``(rows, E)``, or JSON lines ``{"index", "record", "span", "id"?, "embedding"}`` where
``record`` is the record's place in the input (from 0), ``span`` its ``[start, end]`` and ``id``
the ``--id-field`` value, as ``encode`` records its rows' ids.

Everything is checked before the model loads: the options, the model folder's pooling (a
``cls`` folder needs ``--pooling mean`` or ``max``), the input's records and every span
against its text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ..errors import UsageError
from .summary import EncodeSummary

if TYPE_CHECKING:
    from ..corpus import Corpus
    from .encode_options import EncodeOptions

__all__ = ["read_late_chunks", "run_late_chunks"]

SPANS_FIELD = "spans"


def _records(options: EncodeOptions, corpus: Corpus | None, id_field: str | None):  # type: ignore[no-untyped-def]
    from .inputs import read_records

    if corpus is None:
        return read_records(options.input, field=options.field, id_field=id_field)
    from ..corpus.lines import read_corpus

    return read_corpus(corpus, text_field=options.field, id_field=id_field)


def read_late_chunks(
    options: EncodeOptions, corpus: Corpus | None
) -> tuple[list[str], list[list[tuple[int, int]]], list[object] | None]:
    """``(texts, spans, ids)`` of the input, each record's spans checked against its text
    (``ValueError`` naming the record and the span)."""
    from ..arguments import ArgumentTypeError
    from ..encoder.late_chunks import check_spans

    try:
        texts, raw = _records(options, corpus, SPANS_FIELD)
    except ValueError as exc:
        if f"no id field {SPANS_FIELD!r}" in str(exc):
            where = str(exc).split(": no id field", 1)[0]
            raise ValueError(
                f'{where}: no "spans" field; --late-chunks reads JSON lines such as '
                f'{{"text": "...", "spans": [[0, 120], [120, 240]]}} (character offsets, end '
                f"excluded)."
            ) from None
        raise
    ids = None
    if options.id_field is not None:
        ids = _records(options, corpus, options.id_field)[1]
    spans = []
    for i, (text, given) in enumerate(zip(texts, raw or [], strict=True)):
        try:
            spans.append(check_spans(given, text))
        except (ArgumentTypeError, ValueError) as exc:
            raise ValueError(f"{options.input}: record {i} (from 0): {exc}") from None
    return texts, spans, ids


def _payload(
    output: str, rows: np.ndarray, record: list[int], spans: list[tuple[int, int]], ids
) -> Callable[[BinaryIO], None]:  # type: ignore[no-untyped-def]
    """The rows as ``.npy``, or JSON lines with each row's source."""
    from .outputs import embeddings_payload

    if output != "-" and Path(output).suffix.lower() == ".npy":
        return embeddings_payload(output, rows)

    def jsonl(f: BinaryIO) -> None:
        for i, row in enumerate(rows):
            out: dict[str, object] = {"index": i, "record": record[i], "span": list(spans[i])}
            if ids is not None:
                out["id"] = ids[record[i]]
            out["embedding"] = [float(str(v)) for v in row]  # float32's shortest repr
            f.write(json.dumps(out, allow_nan=False).encode() + b"\n")

    return jsonl


def check_pooling(options: EncodeOptions) -> None:
    """``cls`` or ``lasttoken`` pooling (given, or the folder's) cannot pool a span: refused
    before the model loads."""
    pooling = options.pooling
    if pooling is None:
        from ..encoder import resolve_model

        try:
            pooling = resolve_model(options.model).pooling
        except (OSError, ValueError):
            return  # the loading reports the folder
    if pooling in ("cls", "lasttoken"):
        token = "[CLS]" if pooling == "cls" else "its last token"
        given = f"--pooling {pooling}" if options.pooling else f"the model folder pools {token}"
        raise UsageError(
            f"--late-chunks pools each span's own tokens, and {given}: one state for the whole "
            f"text; add --pooling mean (or max)."
        )


def run_late_chunks(
    options: EncodeOptions, out: Path | None, corpus: Corpus | None, load: Callable[[], object]
) -> EncodeSummary:
    """Read and check the input, then load the model (``load()``) and write one row per
    span."""
    check_pooling(options)
    texts, spans, ids = read_late_chunks(options, corpus)
    bert = load()
    start = time.perf_counter()
    parts, record, flat = [], [], []
    each = {k: getattr(options, k) for k in ("pooling", "normalize", "max_length", "batch_size")}
    for i, (text, these) in enumerate(zip(texts, spans, strict=True)):
        parts.append(bert.encode_late_chunks(text, these, **each))  # type: ignore[attr-defined]
        record += [i] * len(these)
        flat += these
    width = int(bert.get_embedding_dimension())  # type: ignore[attr-defined]
    rows = np.concatenate(parts) if parts else np.zeros((0, width), np.float32)
    from .outputs import write_output

    write_output(out, _payload(str(options.output), rows, record, flat, ids))
    seconds = time.perf_counter() - start
    return EncodeSummary(
        Path("<stdout>") if out is None else out,
        f"{len(texts)} texts, {len(rows)} spans, {len(rows)} x {rows.shape[1]} float32 in "
        f"{seconds:.1f}s",
    )
