"""`bertattn export-onnx`: write a BERT model as one ONNX file for ONNX Runtime
(options: :class:`bertattn.jobs.ExportOptions`)."""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.export_options import ExportOptions
    from ..jobs.fields import add_arguments

    add_arguments(p, ExportOptions)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..jobs.export import run_export
    from ..jobs.export_options import ExportOptions
    from ..jobs.fields import from_namespace

    options = from_namespace(ExportOptions, args)
    start = time.perf_counter()
    out = run_export(options)
    size = Path(out).stat().st_size / 2**20
    opset = _written_opset(out)
    if options.quiet:
        return 0
    print(
        f"bertattn export-onnx: wrote {out} ({size:.1f} MiB, opset {opset}, backend "
        f"{options.backend}) in {time.perf_counter() - start:.1f}s",
        file=sys.stderr,
    )
    return 0


def _written_opset(path) -> str:  # type: ignore[no-untyped-def]
    """The default-domain opset recorded in the file (what was written, not what was asked)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return ", ".join(str(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx"))
