"""`bertattn encode`: embed every line of a file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="text file (one text per line), .jsonl, or - for stdin")
    p.add_argument("-o", "--output", required=True, help="output .npy or .jsonl")
    p.add_argument("--model", default=None, help="model folder or hub name (default MiniLM)")
    p.add_argument("--field", default=None, help="JSON field holding the text (default text)")
    p.add_argument("--pooling", choices=("mean", "cls"), default=None)
    p.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalize the embeddings (default: as the model folder says)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=None, help="tokens (default: the model's)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="compute dtype (bfloat16: ~2x faster on CPUs with AVX512-BF16/AMX; output float32)",
    )
    p.add_argument(
        "--onnx",
        default=None,
        metavar="MODEL.onnx",
        help="run this exported model (bertattn export-onnx) in ONNX Runtime; --model names the "
        "folder it came from (tokenizer, pooling)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group(
        "distributed / resumable",
        "Under torchrun (WORLD_SIZE > 1), with --workers, or with --resumable the input is cut "
        "into chunks written to OUTPUT.parts/ as they finish; a rerun of the same command "
        "resumes, and the parts folder is removed once OUTPUT is complete.",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="run N local ranks (torchrun --standalone --nproc-per-node N)",
    )
    g.add_argument(
        "--resumable", action="store_true", help="chunked and resumable even in one process"
    )
    g.add_argument(
        "--restart", action="store_true", help="discard OUTPUT.parts/ of an earlier run first"
    )
    g.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens per chunk (default: total/64, clamped to 8192..65536)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="give up when no chunk finishes (or a collective waits) this long (default 1800)",
    )


def _job_settings(args: argparse.Namespace) -> dict[str, object]:
    """The encoding settings both paths (single process, chunked) pass on unchanged."""
    return {
        "model": args.model,
        "pooling": args.pooling,
        "normalize": args.normalize,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "field": args.field,
        "dtype": args.dtype,
    }


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The same command for each rank of --workers, minus --workers, plus --resumable."""
    argv = ["encode", args.input, "-o", args.output, "--batch-size", str(args.batch_size)]
    for flag, value in (
        ("--model", args.model),
        ("--field", args.field),
        ("--pooling", args.pooling),
        ("--max-length", args.max_length),
        ("--chunk-tokens", args.chunk_tokens),
        ("--timeout", args.timeout),
        ("--dtype", args.dtype),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.normalize is not None:
        argv.append("--normalize" if args.normalize else "--no-normalize")
    argv += ["--resumable"] + ["--quiet"] * args.quiet + ["--restart"] * args.restart
    return argv


def run(args: argparse.Namespace) -> int:
    import signal
    import warnings

    from tqdm import tqdm

    from ..bert.encode_job import encode_file
    from ..distributed import RankInfo

    info = RankInfo.from_env()
    if args.workers is not None and args.onnx:
        raise ValueError("--onnx runs in a single process; it cannot be combined with --workers.")
    if args.workers is not None:
        if info.world_size > 1:
            raise ValueError("--workers starts its own ranks; do not combine it with torchrun.")
        from ..distributed import launch_workers

        return launch_workers(args.workers, _child_argv(args))
    chunked = info.world_size > 1 or args.resumable or args.restart
    if chunked and args.onnx:
        raise ValueError(
            "--onnx runs in a single process; drop --workers / --resumable / --restart "
            "(or torchrun), or encode with the PyTorch model."
        )

    def show(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        print(f"bertattn encode: warning: {message}", file=sys.stderr)

    def on_sigterm(signum, frame):  # type: ignore[no-untyped-def]
        raise SystemExit(128 + signum)  # unwinds: the temporary output file is removed

    bars: list[tqdm] = []

    def progress(total: int):  # type: ignore[no-untyped-def]
        bar = tqdm(total=total, unit="text", desc="encode", file=sys.stderr, disable=args.quiet)
        bars.append(bar)
        return bar.update

    signal.signal(signal.SIGTERM, on_sigterm)
    warnings.showwarning = show
    if chunked:
        try:
            return _run_chunked(args, info, progress)
        finally:
            for bar in bars:
                bar.close()
    parts = Path(args.output).with_name(Path(args.output).name + ".parts")
    if parts.is_dir():
        warnings.warn(
            f"{parts} holds the chunks of an interrupted chunked run; this run ignores it "
            f"(pass --resumable to resume it, or remove it)",
            stacklevel=1,
        )
    try:
        summary = encode_file(
            args.input,
            args.output,
            **_job_settings(args),
            progress=progress,
            onnx=args.onnx,
        )
    except KeyboardInterrupt:
        print("bertattn encode: interrupted; no output written", file=sys.stderr)
        return 130
    finally:
        for bar in bars:
            bar.close()
    print(f"bertattn encode: {summary}", file=sys.stderr)
    return 0


def _run_chunked(args: argparse.Namespace, info, progress) -> int:  # type: ignore[no-untyped-def]
    import logging

    from ..distributed import DistributedEncodeError, encode_file_chunked

    if info.rank == 0:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("bertattn encode: %(message)s"))
        log = logging.getLogger("bertattn.distributed")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    who = f"rank {info.rank}: " if info.world_size > 1 else ""
    keep = f"finished chunks are kept in {args.output}.parts; rerun the same command to resume"
    try:
        summary = encode_file_chunked(
            args.input,
            args.output,
            **_job_settings(args),
            chunk_tokens=args.chunk_tokens,
            restart=args.restart,
            timeout=args.timeout,
            progress=None if args.quiet else progress,
            rank_info=info,
        )
    except DistributedEncodeError as exc:
        print(f"bertattn encode: {who}error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bertattn encode: {who}interrupted; no output written; {keep}", file=sys.stderr)
        return 130
    except SystemExit:
        print(
            f"bertattn encode: {who}stopped by a signal; no output written; {keep}", file=sys.stderr
        )
        raise
    if summary is not None:
        print(f"bertattn encode: {summary}", file=sys.stderr)
    return 0
