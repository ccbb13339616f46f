"""`bertattn encode`: embed every line of a file."""

from __future__ import annotations

import argparse
import sys


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
        "--onnx",
        default=None,
        metavar="MODEL.onnx",
        help="run this exported model (bertattn export-onnx) in ONNX Runtime; --model names the "
        "folder it came from (tokenizer, pooling)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import signal
    import warnings

    from tqdm import tqdm

    from ..bert.encode_job import encode_file

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
    try:
        summary = encode_file(
            args.input,
            args.output,
            model=args.model,
            pooling=args.pooling,
            normalize=args.normalize,
            batch_size=args.batch_size,
            max_length=args.max_length,
            field=args.field,
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
