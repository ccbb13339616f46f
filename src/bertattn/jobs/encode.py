"""The encode job: texts from a file in, sentence embeddings (``.npy`` / ``.jsonl``) out.

:func:`run_encode` checks everything it can before the work (the options on construction, then
the machine, the input and the output), picks the engine, and writes the output through
:mod:`bertattn.files`:

* one process (PyTorch, or ONNX Runtime with ``onnx=``);
* resumable chunks (``resumable`` / ``restart``, and every torchrun rank):
  :func:`bertattn.distributed.encode_chunked`;
* ``workers=N`` local ranks: the same job, N times, through torchrun's launcher.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import JobError, UsageError
from ..files import check_output, write_atomic
from .inputs import check_input, read_records
from .options import EMBEDDING_FORMATS, EncodeOptions, flag, job_device, max_workers, to_argv

__all__ = ["EncodeSummary", "embeddings_payload", "run_encode"]

Progress = Callable[[int], Callable[[int], object]]


@dataclass
class EncodeSummary:
    """What an encode job did, for the final report line (``str(summary)``)."""

    output: Path
    detail: str

    def __str__(self) -> str:
        return f"{self.output}: {self.detail}"


def embeddings_payload(
    output: str | Path, embeddings: np.ndarray, ids: Sequence[object] | None = None
) -> Callable[[BinaryIO], None]:
    """A writer of ``(N, E)`` float32 embeddings in the format of ``output``'s suffix:
    ``.npy`` (``numpy.save``), or JSON lines (``.jsonl`` and ``-``, stdout): one
    ``{"index", "id" (with ``ids``), "embedding"}`` object a line, written by the json module;
    each number is the shortest decimal that reads back as the same float32."""
    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be 2-D (N, E), got shape {emb.shape}.")
    if ids is not None and len(ids) != len(emb):
        raise ValueError(f"{len(ids)} ids for {len(emb)} embeddings.")
    if str(output) != "-" and Path(output).suffix.lower() == ".npy":
        return lambda f: np.save(f, emb, allow_pickle=False)
    bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
    if bad.size:
        raise ValueError(
            f"embedding {int(bad[0])} holds NaN or infinity ({bad.size} row(s)); JSON cannot "
            f"hold them: check the model folder, or write .npy."
        )

    def jsonl(f: BinaryIO) -> None:
        for i, row in enumerate(emb):
            record: dict[str, object] = {"index": i}
            if ids is not None:
                record["id"] = ids[i]
            record["embedding"] = [float(str(v)) for v in row]  # float32's shortest repr
            f.write(json.dumps(record, allow_nan=False).encode() + b"\n")

    return jsonl


def _write(out: Path | None, payload: Callable[[BinaryIO], None]) -> None:
    """To the output file atomically, or to stdout (``out`` None)."""
    if out is not None:
        write_atomic(out, payload)
        return
    payload(sys.stdout.buffer)
    sys.stdout.buffer.flush()


def _check_machine(options: EncodeOptions, world_size: int) -> None:
    if options.onnx is not None and options.device.startswith("cuda"):
        raise UsageError(
            "--onnx runs on ONNX Runtime's CPU provider here; drop --device "
            f"{options.device}, or encode with the PyTorch model on the GPU."
        )
    if options.device != "auto":
        job_device(options.device)  # a device this machine lacks: refused before any work
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


def check_paths(options: EncodeOptions) -> Path | None:
    """The input exists and the output can be written (not the input, not a folder); None for
    ``-`` (stdout)."""
    inputs = [options.input] if str(options.input) != "-" else []
    if inputs:
        check_input(options.input)
    if options.onnx is not None:
        inputs.append(check_input(options.onnx, what="--onnx file"))
    if str(options.output) == "-":
        return None
    return check_output(options.output, what="--output", inputs=inputs, suffixes=EMBEDDING_FORMATS)


def _load(options: EncodeOptions, device=None):  # type: ignore[no-untyped-def]
    """The model on ``device`` (a torch.device; None: the CPU)."""
    from ..bert import Bert

    if options.onnx is not None:
        from ..deploy.onnx_runtime import load_onnx_bert

        bert = load_onnx_bert(options.onnx, options.model)
    else:
        bert = Bert.load(options.model, dtype=options.dtype, device=device)
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
    _check_machine(options, info.world_size)
    out = check_paths(options)
    if options.workers is not None:
        return _run_workers(options, out)  # type: ignore[arg-type]  (not stdout: refused)
    if options.chunked or info.world_size > 1:
        return _run_chunked(options, out, info, progress)
    return _run_single(options, out, progress)


def _run_single(
    options: EncodeOptions, out: Path | None, progress: Progress | None
) -> EncodeSummary:
    parts = None if out is None else out.with_name(out.name + ".parts")
    if parts is not None and parts.is_dir():
        warnings.warn(
            f"{parts} holds the chunks of an interrupted chunked run; this run ignores it "
            f"(pass --resumable to resume it, or remove it)",
            stacklevel=2,
        )
    bert = _load(options, None if options.onnx else job_device(options.device))
    texts, ids = read_records(options.input, field=options.field, id_field=options.id_field)
    start = time.perf_counter()
    kwargs = _encode_kwargs(options, bert)
    callback = None if progress is None else progress(len(texts))
    emb, stats = bert.encode_with_stats(texts, progress=callback, **kwargs)
    _write(out, embeddings_payload(options.output, emb, ids))
    seconds = time.perf_counter() - start
    rate = stats.texts / seconds if seconds > 0 else float("inf")
    return EncodeSummary(
        Path("<stdout>") if out is None else out,
        f"{stats.texts} texts ({stats.empty} empty, {stats.truncated} truncated to "
        f"{kwargs['max_length']} tokens), {stats.texts} x {emb.shape[1]} float32 in "
        f"{seconds:.1f}s, {rate:.1f} texts/s",
    )


def _run_chunked(options, out, info, progress) -> EncodeSummary | None:  # type: ignore[no-untyped-def]
    from ..distributed import DistributedEncodeError, PartsFolder, encode_chunked, run_identity

    device = info.device if options.device == "auto" else job_device(options.device)
    bert = _load(options, device)
    texts, ids = read_records(options.input, field=options.field, id_field=options.id_field)
    kwargs = _encode_kwargs(options, bert)
    settings = {
        **options.settings(),
        "pooling": bert.pooling if options.pooling is None else options.pooling,
        "normalize": bert.normalize if options.normalize is None else options.normalize,
        "max_length": kwargs["max_length"],
        "chunk_tokens": "auto" if options.chunk_tokens is None else options.chunk_tokens,
    }
    identity = run_identity(
        Path(options.input),
        len(texts),
        "default" if options.model is None else str(options.model),
        bert.folder.files(),
        settings,
    )
    try:
        summary = encode_chunked(
            bert,
            texts,
            parts=PartsFolder(out),
            identity=identity,
            encode_kwargs=kwargs,
            write=lambda emb: write_atomic(out, embeddings_payload(out, emb, ids)),
            chunk_tokens=options.chunk_tokens,
            restart=options.restart,
            timeout=options.wait_seconds,
            progress=progress,
            rank_info=info,
        )
    except DistributedEncodeError as exc:
        raise JobError(str(exc)) from exc
    return None if summary is None else EncodeSummary(out, str(summary))


def _run_workers(options: EncodeOptions, out: Path) -> EncodeSummary:
    from ..distributed import PartsFolder, launch_workers

    argv = ["encode", *to_argv(options, drop=("workers",), resumable=True)]
    code = launch_workers(options.workers, argv)  # type: ignore[arg-type]
    if code == 0:
        return EncodeSummary(out, f"{options.workers} ranks finished")
    if code >= 128:
        raise KeyboardInterrupt if code == 130 else SystemExit(code)
    parts = PartsFolder(out)
    failed = parts.failures() if parts.path.is_dir() else []
    what = "; ".join(f"rank {f.get('rank')} on {f.get('what')}: {f.get('error')}" for f in failed)
    raise JobError(
        f"{flag(EncodeOptions, 'workers')} {options.workers}: "
        f"{what or f'a rank exited with status {code}'}; the finished chunks are kept in "
        f"{parts.path}: rerun the same command to resume."
    )
