"""The encode job: texts in (a file, a folder or glob of files, stdin), sentence embeddings out
(``.npy`` / ``.jsonl``, or a folder of ``.npy`` shards with an index).

:func:`run_encode` checks everything it can before the work (the options on construction, then
the machine, the input and the output), picks the engine, and writes the output through
:mod:`bertattn.files`:

* one process (PyTorch, or ONNX Runtime with ``onnx=``);
* resumable chunks (``resumable`` / ``restart``, a sharded output, and every torchrun rank):
  :func:`bertattn.distributed.run_chunks`, this module giving it the work of one chunk;
* ``workers=N`` local ranks: the same job, N times, through torchrun's launcher.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import JobError, UsageError, describe_os_error, disk_full, exit_status, one_line
from ..files import check_name_length, check_output, write_atomic
from ..stdio import is_closed
from .encode_options import EncodeOptions
from .fields import EMBEDDING_FORMATS, flag, job_device, max_workers, to_argv
from .inputs import check_input, is_stream, read_records, stdin_buffer
from .outputs import embeddings_payload, write_output
from .summary import EncodeSummary

if TYPE_CHECKING:
    from ..corpus import Corpus, Embeddings
    from ..distributed import ChunkStore

__all__ = ["EncodeSummary", "embeddings_payload", "run_encode"]

logger = logging.getLogger("bertattn.encode")

Progress = Callable[..., Callable[[int], object]]  # progress(total, unit="text") -> update(n)
BLOCK_LINES = 1024  # lines of a chunk encoded at a time (the model sorts them by length)


def _check_machine(options: EncodeOptions, world_size: int) -> None:
    if options.onnx is not None and options.device.startswith("cuda"):
        raise UsageError(
            "--onnx runs on ONNX Runtime's CPU provider here; drop --device "
            f"{options.device}, or encode with the PyTorch model on the GPU."
        )
    if options.device != "auto":
        job_device(options.device)  # a device this machine lacks: refused before any work
    if options.cuda_graphs:
        where = "ONNX Runtime's CPU provider" if options.onnx else str(job_device(options.device))
        if not where.startswith("cuda"):
            raise UsageError(
                f"--cuda-graphs needs the PyTorch model on a CUDA device; this run is on "
                f"{where}. Drop --cuda-graphs (graphs are used by default on CUDA)."
            )
    if options.workers is None:
        return
    if world_size > 1:
        raise UsageError("--workers starts its own ranks; do not combine it with torchrun.")
    cap = max_workers()
    if options.workers > cap:
        raise UsageError(
            f"--workers {options.workers} is more ranks than this machine can run at once "
            f"(at most {cap}: one per {'GPU' if _cuda() else 'CPU core'}); use --workers {cap} "
            f"or fewer, or torchrun to spread the work over several machines."
        )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_folder(out: Path, corpus: Corpus | None) -> Path:
    """A sharded output folder: not a file, in an existing writable folder, holding no input
    file, and (when it exists) holding only what bertattn writes there."""
    from ..distributed import ChunkStore

    flag_ = f"--output {out}/"
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"{flag_}: {out} is a file; a sharded output is a folder: choose a new name."
        )
    parent = out.parent
    if not parent.is_dir():
        raise UsageError(f"{flag_}: the folder {parent} does not exist; create it first.")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.is_dir() and not os.access(out, os.W_OK)):
        raise UsageError(f"{flag_}: cannot write there; choose a folder you can write to.")
    for src in corpus.files if corpus is not None else ():
        inside = Path(src.name).resolve().parent
        if inside == out.resolve() or out.resolve() in inside.parents:
            raise UsageError(
                f"{flag_} holds the input file {src.name}; shards written there would mix with "
                f"the input: choose an output folder outside the input."
            )
    if out.is_dir():
        try:
            ChunkStore(out, sharded=True).read_manifest()  # refuses a folder of other files
        except ValueError as exc:
            raise UsageError(f"{flag_}: {exc}") from None
    return out


def check_paths(options: EncodeOptions) -> tuple[Path | None, Corpus | None]:
    """The input files (None for a stream: ``-``, stdin, or a pipe) and the output (None for
    ``-``, stdout): the input exists and can be read, the output can be written (not an input,
    not a folder unless a sharded output is asked for)."""
    from ..corpus import open_corpus

    if str(options.input) == "-":
        stdin_buffer()  # a closed stdin: refused before the model loads
    corpus = None if is_stream(options.input) else open_corpus(options.input)
    inputs: list[str | Path] = [f.name for f in corpus.files] if corpus is not None else []
    if options.onnx is not None:
        inputs.append(check_input(options.onnx, what="--onnx file"))
    if str(options.output) == "-":
        if is_closed(sys.stdout):
            raise UsageError(
                "--output - writes to stdout, which is closed (the command was started with "
                ">&-); give an output file (-o FILE.npy), or run it with a stdout."
            )
        return None, corpus
    if options.sharded:
        folder = Path(str(options.output).rstrip("/" + os.sep) or "/")
        check_name_length(folder, what="--output")
        return _check_folder(folder, corpus), corpus
    check_name_length(options.output, what="--output")
    if Path(options.output).is_dir():
        raise UsageError(
            f"--output {options.output} is a folder; give a file name inside it, or write "
            f"{options.output}/ for one .npy shard per chunk in it."
        )
    out = check_output(options.output, what="--output", inputs=inputs, suffixes=EMBEDDING_FORMATS)
    if options.chunked or options.workers is not None:  # its chunks go to OUTPUT.parts/
        check_name_length(out.with_name(out.name + ".parts"), what=f"--output {out}: its folder")
    return out, corpus


def _check_max_length(options: EncodeOptions) -> None:
    """``--max-length`` within the model's ``max_position_embeddings``, read from its
    ``config.json`` before the input is read or the weights are loaded (a folder that cannot
    be read is left for the loading to report)."""
    if options.max_length is None:
        return
    from ..encoder import resolve_model

    try:
        limit = resolve_model(options.model).config.max_position_embeddings
    except (OSError, ValueError):
        return
    if options.max_length > limit:
        raise UsageError(
            f"--max-length {options.max_length} exceeds what the model takes "
            f"(max_position_embeddings {limit}); use --max-length {limit} or less."
        )


def _load(options: EncodeOptions, device=None):  # type: ignore[no-untyped-def]
    """The model on ``device`` (a torch.device; None: the CPU)."""
    from ..encoder import Bert

    if options.onnx is not None:
        from ..deploy.onnx_runtime import load_onnx_bert
        from ..runtime.threads import choose_threads

        bert = load_onnx_bert(
            options.onnx, options.model, threads=choose_threads(options.threads).threads
        )
        if options.dtype == "auto":
            logger.info("dtype auto: float32, the precision the --onnx model was exported in")
    else:
        bert = Bert.load(
            options.model,
            dtype=options.dtype,
            device=device,
            threads=options.threads,
            compile=options.compile,
            task=options.task,
        )
        bert.cuda_graphs = options.cuda_graphs is not False
    limit = bert.model.config.max_position_embeddings
    if options.max_length is not None and options.max_length > limit:
        raise UsageError(
            f"--max-length {options.max_length} exceeds what the model takes "
            f"(max_position_embeddings {limit}); use --max-length {limit} or less."
        )
    return bert


def _encode_kwargs(options: EncodeOptions, bert) -> dict:  # type: ignore[no-untyped-def]
    return {
        "pooling": options.pooling,
        "normalize": options.normalize,
        "batch_size": options.batch_size,
        "max_length": bert.max_length if options.max_length is None else options.max_length,
    }


def run_encode(options: EncodeOptions, *, progress: Progress | None = None) -> EncodeSummary | None:
    """Run the encode job; the summary (None on torchrun ranks other than 0).

    Raises :class:`UsageError` before any work for options the machine or the files refuse,
    ``ValueError`` for a malformed input or model folder, :class:`JobError` when a chunked or
    ``--workers`` run fails (finished chunks are kept for a rerun).
    """
    from ..distributed import RankInfo

    info = RankInfo.from_env()
    report = os.environ.get("BERTATTN_WORKERS_REPORT", "")
    if report and info.world_size > 1 and options.workers is None:
        return _as_worker(options, progress, info, report)
    return _run_encode(options, progress, info)


def _run_encode(options: EncodeOptions, progress: Progress | None, info) -> EncodeSummary | None:  # type: ignore[no-untyped-def]
    from .heads import can_be_sparse, check_sparse_options, is_sparse_model, run_sparse_encode

    _check_machine(options, info.world_size)
    if options.late_chunks:  # one row per span (bertattn.jobs.late_chunks), one process
        from .late_chunks import run_late_chunks

        _check_max_length(options)
        out, corpus = check_paths(options)
        device = job_device(options.device)
        return run_late_chunks(options, out, corpus, lambda: _load(options, device))
    sparse = is_sparse_model(options.model) if options.sparse is None else options.sparse
    if sparse and not can_be_sparse(options.model):
        raise UsageError(
            f"--sparse needs a SPLADE model (a sentence-transformers folder with SpladePooling, "
            f"or a BertForMaskedLM folder); --model {options.model or 'the default'} is not one: "
            f"drop --sparse."
        )
    if sparse:  # a SPLADE model: sparse rows (bertattn.jobs.heads), one process, JSON lines
        check_sparse_options(options)
    else:
        _check_max_length(options)
    out, corpus = check_paths(options)
    if sparse:
        return run_sparse_encode(options, out, *_read_input(options, corpus))
    if options.workers is not None:
        return _run_workers(options, out)  # type: ignore[arg-type]  (not stdout: refused)
    if options.chunked or info.world_size > 1:
        return _run_chunked(options, out, corpus, info, progress)
    return _run_single(options, out, corpus, progress)


def _as_worker(options: EncodeOptions, progress: Progress | None, info, folder: str):  # type: ignore[no-untyped-def]
    """A rank of ``--workers``: the job, but an error goes to the launcher, which reports the
    cause once for every rank (``bertattn.distributed.launch``); this rank leaves quietly."""
    from ..distributed.launch import wait_for_reports, write_report

    updates: list[Callable[[int], object]] = []

    def tracked(total: int, **kw: object) -> Callable[[int], object]:
        update = progress(total, **kw)  # type: ignore[misc]
        updates.append(update)
        return update

    try:
        return _run_encode(options, None if progress is None else tracked, info)
    except (KeyboardInterrupt, SystemExit) as exc:  # stopped by the launcher (or Ctrl-C): the
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code  # launcher says it
        code = code if isinstance(code, int) else 1
    except Exception as exc:
        code = exit_status(exc)
        if code is None:  # a bug: its traceback, from the command line
            raise
        cause = exc.__cause__
        record = getattr(cause, "record", None)
        echo = bool(getattr(cause, "echo", False))
        report = {"code": code, "message": one_line(exc), "echo": echo}
        if isinstance(record, dict):
            report["record"] = record
        try:
            write_report(folder, info.rank, report)
        except OSError:
            raise exc from None  # said by this rank, then
        if not echo:
            wait_for_reports(folder, info.world_size, 5.0)
    for update in updates:  # the progress bar, closed as the command line would
        close = getattr(getattr(update, "__self__", None), "close", None)
        if callable(close):
            close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_single(
    options: EncodeOptions, out: Path | None, corpus: Corpus | None, progress: Progress | None
) -> EncodeSummary:
    parts = None if out is None else out.with_name(out.name + ".parts")
    if parts is not None and parts.is_dir():
        from ..files import FolderLock

        if (parts / FolderLock.NAME).is_file():
            try:  # a live chunked run writing the same output: refused (UsageError, its pid)
                FolderLock(parts, what=str(parts)).acquire().release()
            except OSError:  # cannot even open the lock file: nothing to tell
                pass
        warnings.warn(
            f"{parts} holds the chunks of an interrupted chunked run; this run ignores it "
            f"(pass --resumable to resume it, or remove it)",
            stacklevel=2,
        )
    bert = _load(options, None if options.onnx else job_device(options.device))
    texts, ids = _read_input(options, corpus)
    start = time.perf_counter()
    kwargs = _encode_kwargs(options, bert)
    by_tokens = None if progress is None else (lambda total: progress(total, unit="token"))
    emb, stats = bert.encode_with_stats(texts, progress_tokens=by_tokens, **kwargs)
    write_output(out, embeddings_payload(options.output, emb, ids))
    seconds = time.perf_counter() - start
    rate = stats.texts / seconds if seconds > 0 else float("inf")
    return EncodeSummary(
        Path("<stdout>") if out is None else out,
        f"{stats.texts} texts ({stats.empty} empty, {stats.truncated} truncated to "
        f"{kwargs['max_length']} tokens), {stats.texts} x {emb.shape[1]} float32 in "
        f"{seconds:.1f}s, {rate:.1f} texts/s",
    )


def _read_input(
    options: EncodeOptions, corpus: Corpus | None
) -> tuple[list[str], list[object] | None]:
    """Every text (and id) of the input: a stream (``corpus`` None) or the corpus's files,
    which must not change while they are read."""
    if corpus is None:
        return read_records(options.input, field=options.field, id_field=options.id_field)
    from ..corpus.lines import read_corpus

    before = corpus.identity()
    texts, ids = read_corpus(corpus, text_field=options.field, id_field=options.id_field)
    changed = corpus.changes(before)
    if changed:  # edited while it was read: its texts may mix old and new lines
        raise JobError(
            f"input {'; '.join(changed[:5])} changed while it was read, so its texts may "
            f"mix old and new lines and nothing is written; rerun once it is no longer "
            f"being written."
        )
    return texts, ids


def _chunk_work(bert, corpus: Corpus, options: EncodeOptions, kwargs: dict):  # type: ignore[no-untyped-def]
    """``work(chunk)`` for the runner: the chunk's lines, block by block, through the model."""
    from ..corpus.lines import read_blocks

    def work(chunk):  # type: ignore[no-untyped-def]
        src = corpus.files[chunk.file]
        blocks = read_blocks(
            src,
            chunk.start,
            chunk.end,
            text_field=options.field,
            id_field=options.id_field,
            block_lines=BLOCK_LINES,
        )
        for block in blocks:
            with warnings.catch_warnings():  # truncation is counted and reported at the end
                warnings.simplefilter("ignore")
                emb, st = bert.encode_with_stats(block.texts, **kwargs)
            counts = {"empty": st.empty, "truncated": st.truncated}
            counts.update(tokens=st.tokens, padded=st.padded)
            if block.skipped:  # blank JSON lines: no row, but the line numbers count them
                counts["skipped"] = block.skipped
            yield emb, counts, block.ids, block.nbytes

    return work


def _run_chunked(
    options: EncodeOptions,
    out: Path,
    corpus: Corpus,
    info,  # type: ignore[no-untyped-def]
    progress: Progress | None,
) -> EncodeSummary | None:
    from ..distributed import ChunkStore, DistributedEncodeError, run_chunks, run_identity

    device = info.device if options.device == "auto" else job_device(options.device)
    bert = _load(options, device)
    kwargs = _encode_kwargs(options, bert)
    settings = {
        **options.settings(),
        "dtype": bert.precision,  # --dtype auto: as resolved here; int8 as such
        "pooling": bert.pooling if options.pooling is None else options.pooling,
        "normalize": bert.normalize if options.normalize is None else options.normalize,
        "max_length": kwargs["max_length"],
        "chunk_size": options.chunk_bytes or "auto",
    }
    identity = (
        {}
        if info.rank
        else run_identity(  # only rank 0 reads the manifest
            corpus.identity(),
            "default" if options.model is None else str(options.model),
            bert.folder.files(),
            settings,
        )
    )
    if identity and bert.dtype_reason:  # --dtype auto: why, with its timings; recorded in the
        identity["dtype_reason"] = bert.dtype_reason  # manifest, not compared on a resume
    store = ChunkStore.for_output(out, sharded=options.sharded)

    def finish(emb: Embeddings) -> None:
        try:
            write_atomic(out, embeddings_payload(out, emb, emb.ids()))
        except OSError as exc:
            raise JobError(_output_failed(exc, out, store.path)) from exc

    try:
        summary = run_chunks(
            store=store,
            files=corpus.files,
            identity=identity,
            work=_chunk_work(bert, corpus, options, kwargs),
            width=bert.pooled_width,
            finish=finish,
            chunk_bytes=options.chunk_bytes,
            restart=options.restart,
            timeout=options.wait_seconds,
            progress=None if progress is None else (lambda total: progress(total, unit="B")),
            max_length=kwargs["max_length"],
            check_inputs=lambda: _check_unchanged(corpus, identity, store, options),
        )
    except DistributedEncodeError as exc:
        raise JobError(str(exc)) from exc
    except OSError as exc:  # e.g. the manifest or the index on a full disk: said in words
        raise JobError(_folder_failed(exc, store.path)) from exc
    if summary is None:
        return None
    where = f"{out}/ ({summary.chunks} shards + index.json)" if options.sharded else out
    return EncodeSummary(Path(str(where)), str(summary))


def _check_unchanged(
    corpus: Corpus, identity: dict, store: ChunkStore, options: EncodeOptions
) -> None:
    """Rank 0, every chunk finished: raise ``JobError`` when an input file changed since the
    run started (its size, modification time or sampled ends differ from the manifest's), as
    its rows may then mix old and new lines; nothing more is written, the chunks are kept."""
    changed = corpus.changes(identity["inputs"])
    if not changed:
        return
    kept = store.finished_count()
    result = "no index is written" if options.sharded else f"{options.output} is not written"
    raise JobError(
        f"input {'; '.join(changed[:5])} changed while the run was going: its rows may mix "
        f"old and new lines, so {result}. Let the input be, then rerun with --restart: the "
        f"{kept} finished chunk(s) in {store.path} whose input bytes are unchanged are kept."
    )


def _output_failed(exc: OSError, out: Path, parts: Path) -> str:
    """Writing the output of a chunked run failed: every chunk is finished and kept."""
    what = describe_os_error(exc).removesuffix(".")
    kept = f"every chunk is finished and kept in {parts}, so the rerun only writes {out}"
    if disk_full(exc):
        return f"{what}. Free disk space in {out.parent}, then rerun the same command: {kept}."
    return f"{what}. Once that is fixed, rerun the same command: {kept}."


def _folder_failed(exc: OSError, parts: Path) -> str:
    """The chunk folder could not be written (outside a chunk: its manifest, its index)."""
    what = describe_os_error(exc).removesuffix(".")
    if disk_full(exc):
        return f"{what}. Free disk space in {parts}, then rerun the same command."
    return f"{what}. Once that is fixed, rerun the same command."


def _run_workers(options: EncodeOptions, out: Path) -> EncodeSummary:
    import tempfile

    from ..distributed import ChunkStore, failure_message, run_workers
    from ..distributed.launch import read_reports, signal_name

    argv = ["encode", *to_argv(options, drop=("workers",), resumable=True)]
    with tempfile.TemporaryDirectory(prefix="bertattn-workers-") as folder:
        result = run_workers(options.workers, argv, report=folder)  # type: ignore[arg-type]
        reports = read_reports(folder)
    code = result.code
    if code == 0:
        return EncodeSummary(out, f"{options.workers} ranks finished")
    parts = ChunkStore.for_output(out, sharded=options.sharded)
    finished = parts.finished_count() if parts.path.is_dir() else 0
    where = f"{flag(EncodeOptions, 'workers')} {options.workers}"
    # a rank that stopped on an error reported it (the others may have been stopped by a
    # signal from the launcher: their status is not the cause); a signal alone reports nothing
    if reports:  # the rank that failed first, not the ones that stopped because it did
        first = next((r for r in reports if not r.get("echo")), reports[0])
        record = first.get("record")
        if isinstance(record, dict):  # said again with the chunks finished by now
            message = failure_message(record, finished, parts.path)
        else:
            message = str(first.get("message", "")).strip()
        raise (UsageError if first.get("code") == 2 else JobError)(f"{where}: {message}")
    if result.rank is None and code >= 128:  # this process was stopped (Ctrl-C, SIGTERM)
        raise KeyboardInterrupt if code == 130 else SystemExit(code)  # said by the command line
    failed = parts.failures() if parts.path.is_dir() else []
    if failed:
        raise JobError(f"{where}: {failure_message(failed[0], finished, parts.path)}")
    kept = f": the finished chunks are kept in {parts.path}" if finished else ""
    if result.signal is not None:  # a rank killed from outside, not by an error of its own
        oom = " (the out-of-memory killer sends it too: see dmesg)" if result.signal == 9 else ""
        raise JobError(
            f"{where}: rank {result.rank} was killed by {signal_name(result.signal)}{oom}; "
            f"the other ranks were stopped. Rerun the same command to resume{kept}."
        )
    raise JobError(
        f"{where}: a rank exited with status {code}. Rerun the same command to resume{kept}."
    )
