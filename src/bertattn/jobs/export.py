"""The export job: a BERT model folder to one ONNX file."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..files import check_output
from .export_options import ExportOptions
from .fields import job_device
from .inputs import check_input

__all__ = ["run_export"]


def run_export(options: ExportOptions) -> Path:
    """Export ``options.model`` to ``options.output``; the path written.

    The output path and the opset are checked before the model is loaded.
    """
    from ..deploy import onnx_export
    from ..encoder.folder import resolve_model

    opset = onnx_export.DEFAULT_OPSET if options.opset is None else options.opset
    try:
        opset = onnx_export.check_opset(opset)
    except ValueError as exc:
        raise UsageError(f"--opset: {exc}") from None
    out = check_output(options.output, what="--output", suffixes=(".onnx",))
    device = job_device(options.device)
    if options.model is not None and Path(options.model).is_file():
        check_input(options.model, what="--model")  # a file: resolve_model explains
    model: object = options.model
    if device.type != "cpu":  # trace on that device (the file is the same)
        from ..encoder import BertModel

        model = BertModel.from_pretrained(resolve_model(options.model)).to(device)
    return onnx_export.export_onnx(model, out, opset=opset, backend=options.backend)
