"""`bertattn export-onnx`: write a BERT model as one ONNX file for ONNX Runtime."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..deploy.onnx_export import DEFAULT_OPSET, EXPORT_BACKENDS

    p.add_argument("--model", default=None, help="model folder (default all-MiniLM-L6-v2)")
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument(
        "--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default %(default)s)"
    )
    p.add_argument(
        "--backend",
        choices=EXPORT_BACKENDS,
        default="math",
        help="attention backend traced into the graph (default math: fastest in ONNX Runtime)",
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..deploy import export_onnx

    start = time.perf_counter()
    out = export_onnx(args.model, args.output, opset=args.opset, backend=args.backend)
    size = Path(out).stat().st_size / 2**20
    print(
        f"bertattn export-onnx: wrote {out} ({size:.1f} MiB, opset {args.opset}, backend "
        f"{args.backend}) in {time.perf_counter() - start:.1f}s",
        file=sys.stderr,
    )
    return 0
