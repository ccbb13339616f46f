"""The jobs of the heads (:mod:`bertattn.heads`) on the command line: ``rerank`` (documents for a
query, by a one-label cross-encoder), ``predict`` (the pipeline of the model's head, one answer
per input) and the sparse rows ``encode`` writes for a SPLADE model.

Each checks, before reading the input or loading the model, the options, the input path, the
output path and the model's head (from its ``config.json`` / ``modules.json`` only), so that a
wrong head is a usage error (exit 2) found before any work. The output is JSON lines, written
whole or not at all (:mod:`bertattn.files`), or to stdout (``-``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import UsageError
from ..files import check_output, write_atomic, write_stdout
from ..stdio import is_closed
from .fields import flag, job_device
from .head_options import HEAD_OUTPUTS, PredictOptions, RerankOptions
from .inputs import is_stream, read_records, stdin_buffer
from .summary import EncodeSummary

if TYPE_CHECKING:
    import numpy as np

    from ..encoder import ModelFolder
    from ..heads.config import HeadConfig
    from .encode_options import EncodeOptions

__all__ = [
    "can_be_sparse",
    "is_sparse_model",
    "read_pairs",
    "run_predict",
    "run_rerank",
    "sparse_payload",
]


# ---------------------------------------------------------------------- checks before work
def _head(model: str) -> tuple[ModelFolder, HeadConfig]:
    """The model's folder and head, from its files (no weights read)."""
    from ..encoder import resolve_model
    from ..heads.config import read_head_config

    folder = resolve_model(model)
    return folder, read_head_config(folder.model_dir, folder.root)


def _named(head: HeadConfig) -> str:
    """The head in words, for a refusal."""
    from ..heads.registry import predicted

    arch = head.architecture or "not given (a bare encoder)"
    kind = predicted(head)
    if kind is not None and kind.task == "text-classification":
        labels = ", ".join(head.id2label[i] for i in sorted(head.id2label)[:6])
        return f"{arch}, {head.num_labels} labels ({labels})"
    return arch


def _check_io(options: RerankOptions | PredictOptions) -> Path | None:
    """The input exists and can be read; the output (None: stdout) can be written and is not
    the input."""
    from ..corpus import open_corpus

    if str(options.input) == "-":
        stdin_buffer()  # a closed stdin: refused now
    inputs = [] if is_stream(options.input) else [f.name for f in open_corpus(options.input).files]
    if str(options.output) == "-":
        if is_closed(sys.stdout):
            raise UsageError(
                "--output - writes to stdout, which is closed (the command was started with "
                ">&-); give an output file (-o FILE.jsonl), or run it with a stdout."
            )
        return None
    return check_output(options.output, what="--output", inputs=inputs, suffixes=HEAD_OUTPUTS)


def _load(options: RerankOptions | PredictOptions) -> dict[str, Any]:
    """The keywords every head takes to load (``device``, ``dtype``, ``threads``); a device
    this machine lacks is refused here (``UsageError``), before any work."""
    device = job_device(options.device)
    return {"device": device, "dtype": options.dtype, "threads": options.threads}


def _check_max_length(folder: ModelFolder, options: RerankOptions | PredictOptions) -> None:
    """``--max-length`` within the model's position limit (from its config: before any work)."""
    limit = folder.config.max_position_embeddings
    if options.max_length is not None and options.max_length > limit:
        raise UsageError(
            f"--max-length {options.max_length} exceeds what the model takes "
            f"(max_position_embeddings {limit}); use --max-length {limit} or less."
        )


def _check_pair_room(bert: Any, options: RerankOptions) -> None:
    """``--max-length`` holds the model's pair template and a token of the query and of each
    document (else every document scores the same: its pair cut to the special tokens)."""
    from ..heads.text_inputs import pair_minimum

    least = pair_minimum(bert)
    if options.max_length is not None and options.max_length < least:
        raise UsageError(
            f"--max-length {options.max_length} cannot hold a query-document pair for this "
            f"model: its tokenizer adds {least - 2} special tokens to a pair, and the query and "
            f"the document need a token each; use --max-length {least} or more."
        )


def _max_length(bert: Any, options: RerankOptions | PredictOptions) -> None:
    """``--max-length`` (checked by :func:`_check_max_length`) set on the loaded encoder."""
    if options.max_length is not None:
        bert.max_seq_length = options.max_length


def _record_line(source: str, index: int, field: str | None) -> str:
    """Where record ``index`` (0-based, in input order) of ``source`` is: ``FILE: line N``
    (read again: only an error asks), or ``<stdin>: record N`` for a stream read once."""
    if is_stream(source):
        name = "<stdin>" if str(source) == "-" else str(source)
        return f"{name}: record {index + 1}"
    from ..corpus import open_corpus

    seen = 0
    for src in open_corpus(source).files:
        records = bool(src.jsonl or field is not None)  # JSON lines: blank lines are no record
        with src.open_stream() as f:
            for n_line, raw in enumerate(f, start=1):
                if records and not raw.strip():
                    continue
                if seen == index:
                    return f"{src.name}: line {n_line}"
                seen += 1
    return f"{source}: record {index + 1}"


def _text_key(options: RerankOptions | PredictOptions) -> str:
    """The JSON field the texts come from ("" for plain text lines)."""
    return (options.field or "text") if _is_jsonl(str(options.input), options.field) else ""


def _check_unicode(
    options: RerankOptions | PredictOptions, texts: Sequence[str], what: str, key: str = ""
) -> None:
    """Refuse a text holding a lone surrogate (a ``\\ud800`` escape in a JSON line) before the
    model loads, naming the file and line it came from (``ValueError``: exit 1)."""
    from ..encoder.tokenizer import InvalidTextError, check_unicode

    try:
        check_unicode(texts, what)
    except InvalidTextError as exc:
        where = _record_line(str(options.input), exc.index, options.field)
        field = f"field {key!r}" if key else "the text"
        raise ValueError(
            f"{where}: {field} holds a lone surrogate (U+{ord(exc.char):04X}) at character "
            f"{exc.position}: it is not valid Unicode (half of a UTF-16 pair, such as a lone "
            f"\\u{ord(exc.char):04x} escape); fix that line where it was made, or drop it."
        ) from None


# ---------------------------------------------------------------------- output
def jsonl_payload(rows: Iterable[object]) -> Callable[[BinaryIO], None]:
    """A writer of one JSON value a line (floats as Python's shortest repr: they read back
    equal)."""

    def write(f: BinaryIO) -> None:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, allow_nan=False).encode() + b"\n")

    return write


def _write(out: Path | None, payload: Callable[[BinaryIO], None]) -> Path:
    if out is None:
        write_stdout(payload)
        return Path("<stdout>")
    return write_atomic(out, payload)


def _empty(options: RerankOptions | PredictOptions, what: str) -> ValueError:
    name = "stdin" if str(options.input) == "-" else str(options.input)
    return ValueError(
        f"input {name} holds no {what} (it is empty, or has only blank JSON lines); nothing is "
        f"written."
    )


# ---------------------------------------------------------------------- rerank
def run_rerank(options: RerankOptions) -> EncodeSummary:
    """Rank the documents of ``options.input`` for ``options.query``; JSON lines best first,
    each as :meth:`bertattn.CrossEncoder.rank` returns it (``id`` after ``corpus_id`` with
    ``--id-field``)."""
    from ..heads.registry import CROSS_ENCODER, predicted

    folder, head = _head(options.model)
    kind = predicted(head)
    if kind is not CROSS_ENCODER:
        raise UsageError(
            f"--model {options.model}: rerank needs a one-label BertForSequenceClassification "
            f"(a reranker); this model's head is {_named(head)}"
            + (": use bertattn predict." if kind is not None else ".")
        )
    _check_max_length(folder, options)
    load = _load(options)
    out = _check_io(options)
    docs, ids = read_records(options.input, field=options.field, id_field=options.id_field)
    if not docs:
        raise _empty(options, "documents")
    _check_query(options.query)
    _check_unicode(options, docs, "documents", _text_key(options))
    from ..heads import CrossEncoder

    start = time.perf_counter()
    model = CrossEncoder(folder, **load)
    _max_length(model.bert, options)
    _check_pair_room(model.bert, options)
    ranked = model.rank(
        options.query,
        docs,
        top_k=options.top_k,
        return_documents=options.return_documents,
        batch_size=options.batch_size,
        max_tokens_per_doc=options.max_tokens_per_doc,
    )
    if ids is not None:
        ranked = [{"corpus_id": r["corpus_id"], "id": ids[r["corpus_id"]], **r} for r in ranked]
    where = _write(out, jsonl_payload(ranked))
    seconds = time.perf_counter() - start
    return EncodeSummary(
        where, f"{len(docs)} documents ranked, {len(ranked)} written, in {seconds:.1f}s"
    )


def _check_query(query: str) -> None:
    """Refuse a query holding a lone surrogate (``UsageError``: it is an argument)."""
    from ..encoder.tokenizer import InvalidTextError, check_unicode

    try:
        check_unicode([query], "query")
    except InvalidTextError as exc:
        raise UsageError(
            f"QUERY holds a lone surrogate (U+{ord(exc.char):04X}) at character {exc.position}: "
            f"it is not valid Unicode; pass the query as UTF-8 text."
        ) from None


# ---------------------------------------------------------------------- predict
def _check_predict_options(options: PredictOptions, head: HeadConfig) -> str:
    """The task of the model's head; ``UsageError`` for an option that head does not take."""
    from ..heads.registry import predicted

    kind = predicted(head)
    if kind is None or kind.task is None:
        raise UsageError(
            f"--model {options.model}: predict needs a BertForSequenceClassification, "
            f"BertForTokenClassification or BertForMaskedLM checkpoint; this model's head is "
            f"{_named(head)} (for sentence embeddings use bertattn encode)."
        )
    task = kind.task
    takes = {
        "text-classification": ("top_k", "function_to_apply"),
        "token-classification": ("aggregation_strategy",),
        "fill-mask": ("top_k",),
    }[task]
    for name in ("top_k", "function_to_apply", "aggregation_strategy"):
        if getattr(options, name) is not None and name not in takes:
            raise UsageError(
                f"{flag(PredictOptions, name)} does not apply to this model: its head is "
                f"{_named(head)} ({task}), which takes "
                f"{', '.join(flag(PredictOptions, n) for n in takes)}; drop "
                f"{flag(PredictOptions, name)}."
            )
    return task


def read_pairs(
    source: str, *, field: str | None = None, task: str = "text-classification"
) -> list[str | dict[str, str]]:
    """The inputs of a predict run: each a text, or for ``task`` text-classification
    ``{"text", "text_pair"}`` where a JSON line carries a string ``"text_pair"`` (null or
    absent: a single text). Another task refuses a pair (``ValueError`` naming the line)."""
    if is_stream(source):
        if not _is_jsonl(source, field):
            return list(read_records(source, field=field)[0])
        with _spooled(source) as copy:  # JSON lines are read twice: from a copy
            try:
                return read_pairs(copy, field=field or "text", task=task)
            except ValueError as exc:  # named as the user gave it, not as the copy
                name = "<stdin>" if str(source) == "-" else str(source)
                raise ValueError(str(exc).replace(copy, name)) from None
    from ..corpus import open_corpus

    items: list[str | dict[str, str]] = []
    for src in open_corpus(source).files:
        texts = read_records(src.name, field=field)[0]
        if not (src.jsonl or field is not None):
            items += texts
            continue
        pairs = _pair_values(src, field or "text", task)
        if len(pairs) != len(texts):  # the file changed between the two reads
            raise ValueError(f"input {src.name} changed while it was read; rerun.")
        items += [
            t if p is None else {"text": t, "text_pair": p}
            for t, p in zip(texts, pairs, strict=True)
        ]
    return items


@contextlib.contextmanager
def _spooled(source: str) -> Iterator[str]:
    """A stream (stdin, a pipe) copied into a temporary ``.jsonl`` file, removed afterwards."""
    import shutil
    import tempfile

    with contextlib.ExitStack() as stack:
        if str(source) == "-":
            stream: BinaryIO = stdin_buffer()
        else:
            stream = stack.enter_context(open(source, "rb"))  # noqa: SIM115
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bertattn-predict-"))
        copy = Path(tmp) / "stdin.jsonl"
        with copy.open("wb") as f:
            shutil.copyfileobj(stream, f)
        yield str(copy)


def _is_jsonl(source: str, field: str | None) -> bool:
    from ..corpus.sources import JSONL_SUFFIXES

    return field is not None or str(source).lower().endswith(JSONL_SUFFIXES)


def _pair_values(src: Any, field: str, task: str) -> list[str | None]:
    """Each JSON record's ``"text_pair"`` of the file ``src`` (None when absent or null), in
    order; ``ValueError`` naming the line for one that is not a string, or for any pair when
    ``task`` takes single texts. The records were read (and checked) once already."""
    from ..corpus.lines import json_kind

    values: list[str | None] = []
    with src.open_stream() as f:
        for n_line, raw in enumerate(f, start=1):
            line = raw.strip()
            if n_line == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line:
                continue
            pair = json.loads(line).get("text_pair")
            where = f"{src.name}: line {n_line}"
            if pair is not None and task != "text-classification":
                raise ValueError(
                    f"{where}: a text pair (text_pair), but this model's {task} takes single "
                    f"texts; drop text_pair, or use a sequence classifier."
                )
            if pair is not None and not isinstance(pair, str):
                raise ValueError(
                    f"{where}: field 'text_pair' is {json_kind(pair)}, not a string; a pair is "
                    f'{{"{field}": "...", "text_pair": "..."}} (null or absent: a single text).'
                )
            values.append(pair)
    return values


def _pipeline_answers(pipe: Any, task: str, items: list, options: PredictOptions) -> list:
    """One answer per input, exactly as ``pipe(items)`` gives each."""
    kwargs: dict[str, Any] = {"batch_size": options.batch_size}
    if task == "text-classification":
        if options.top_k is not None:
            kwargs["top_k"] = options.top_k
        kwargs["function_to_apply"] = options.function_to_apply
    elif task == "token-classification":
        kwargs["aggregation_strategy"] = options.aggregation_strategy or "none"
    elif options.top_k is not None:
        kwargs["top_k"] = options.top_k
    answers = pipe(items, **kwargs)
    if task == "fill-mask" and len(items) == 1:  # the pipeline unwraps a list of one
        answers = [answers]
    return answers


def run_predict(options: PredictOptions) -> EncodeSummary:
    """The pipeline of the model's head over every input; one JSON line per input, each the
    pipeline's answer for it."""
    folder, head = _head(options.model)
    task = _check_predict_options(options, head)
    _check_max_length(folder, options)
    load = _load(options)
    out = _check_io(options)
    items = read_pairs(options.input, field=options.field, task=task)
    if not items:
        raise _empty(options, "inputs")
    texts = [x if isinstance(x, str) else x["text"] for x in items]
    _check_unicode(options, texts, "inputs", _text_key(options))
    pairs = [(x.get("text_pair") or "") if isinstance(x, dict) else "" for x in items]
    _check_unicode(options, pairs, "inputs", "text_pair")
    from ..heads import pipeline

    start = time.perf_counter()
    pipe = pipeline(task, folder, **load)
    _max_length(pipe.model.bert if task == "text-classification" else pipe.bert, options)
    answers = _pipeline_answers(pipe, task, items, options)
    where = _write(out, jsonl_payload(answers))
    seconds = time.perf_counter() - start
    return EncodeSummary(where, f"{len(items)} inputs ({task}) in {seconds:.1f}s")


# ---------------------------------------------------------------------- sparse encode
def is_sparse_model(model: str | None) -> bool:
    """Whether ``encode`` writes sparse rows for ``model`` by default: a sentence-transformers
    folder whose ``modules.json`` has ``SpladePooling``. A plain ``BertForMaskedLM`` folder
    (SPLADE, or a plain BERT such as bert-base-uncased) stays dense unless ``--sparse``."""
    from ..heads.registry import sparse_rows

    return sparse_rows(model, None)


def can_be_sparse(model: str | None) -> bool:
    """Whether ``--sparse`` can run ``model``: a SpladePooling folder or a BertForMaskedLM."""
    from ..heads.registry import sparse_rows

    return sparse_rows(model, True)


def check_sparse_options(options: EncodeOptions) -> None:
    """``UsageError`` for what a sparse (SPLADE) encode cannot do: ``.npy`` output, a pooling
    or normalization of its own, ONNX, chunked and several-rank runs."""
    name = options.model
    if str(options.output) != "-" and str(options.output).lower().endswith(".npy"):
        raise UsageError(
            f"--model {name} is a SPLADE (sparse) model: its rows are vocabulary-wide (tens of "
            f"thousands of columns) and mostly zeros, which .npy would store densely; write "
            f'.jsonl (one {{"index", "indices", "values"}} object per input), or pass '
            f"--no-sparse for dense embeddings of its encoder."
        )
    given = [
        f
        for f, on in (
            ("--pooling", options.pooling is not None),
            ("--normalize/--no-normalize", options.normalize is not None),
            ("--onnx", options.onnx is not None),
            ("--cuda-graphs", options.cuda_graphs is not None),
            ("--compile", options.compile),
            ("--workers", options.workers is not None),
            ("--resumable/--restart", options.resumable or options.restart),
            ("a folder output", options.sharded),
        )
        if on
    ]
    if given or options.chunked:
        what = ", ".join(given) or "a chunked run (torchrun)"
        raise UsageError(
            f"--model {name} is a SPLADE (sparse) model, encoded in one process with its own "
            f"pooling; {what} applies to dense embeddings only: drop it, or pass --no-sparse."
        )
    if options.max_length is not None:  # from the folder's config: before the model loads
        from ..heads.registry import SPARSE, FolderProbe

        limit = SPARSE.encoder(FolderProbe(name, sparse=True)).config.max_position_embeddings
        if options.max_length > limit:
            raise UsageError(
                f"--max-length {options.max_length} exceeds what the model takes "
                f"(max_position_embeddings {limit}); use --max-length {limit} or less."
            )


#: texts encoded at a time by a sparse run: its dense (texts x vocabulary) float32 rows are
#: held for one block only (1024 x 30,522 x 4 bytes = 125 MB), each row kept as its non-zeros
SPARSE_BLOCK = 1024


def sparse_payload(
    rows: Sequence[tuple[np.ndarray, np.ndarray]], ids: list[object] | None
) -> Callable[[BinaryIO], None]:
    """JSON lines ``{"index", "id" (with ids), "indices", "values"}`` of ``rows``, each the
    (vocabulary ids ascending, float32 weights) of one input's non-zero weights; a weight is
    written as the shortest decimal that reads back as the same float32."""

    def write(f: BinaryIO) -> None:
        for i, (indices, values) in enumerate(rows):
            record: dict[str, object] = {"index": i}
            if ids is not None:
                record["id"] = ids[i]
            record["indices"] = indices.tolist()
            record["values"] = [float(str(v)) for v in values]
            f.write(json.dumps(record, allow_nan=False).encode() + b"\n")

    return write


def run_sparse_encode(
    options: EncodeOptions, out: Path | None, texts: list[str], ids: list[object] | None
) -> EncodeSummary:
    """SPLADE rows of ``texts`` (as :meth:`bertattn.SparseEncoder.encode` computes them)
    written as :func:`sparse_payload`."""
    import numpy as np

    from ..heads import SparseEncoder

    start = time.perf_counter()
    load = {"dtype": options.dtype, "threads": options.threads}
    model = SparseEncoder(options.model, device=job_device(options.device), **load)
    if options.max_length is not None:  # checked by check_sparse_options, before the input
        model.bert.max_seq_length = options.max_length
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    for at in range(0, len(texts), SPARSE_BLOCK):
        block = model.encode(
            texts[at : at + SPARSE_BLOCK],
            batch_size=options.batch_size,
            convert_to_sparse_tensor=False,
        )
        for row in block.float().numpy():
            nz = np.flatnonzero(row)
            rows.append((nz, row[nz].astype(np.float32)))
    where = _write(out, sparse_payload(rows, ids))
    seconds = time.perf_counter() - start
    active = sum(len(r[0]) for r in rows) / len(rows) if rows else 0.0
    return EncodeSummary(
        where,
        f"{len(texts)} texts, SPLADE sparse rows of {model.vocab_size} (mean {active:.1f} "
        f"active) in {seconds:.1f}s"
        + ("" if options.sparse else "; --no-sparse writes dense embeddings of its encoder"),
    )
