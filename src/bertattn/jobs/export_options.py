"""``bertattn export-onnx``'s options: :class:`ExportOptions`."""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from ..errors import UsageError
from .fields import DEVICE_HELP, check_choice, check_device, check_int, check_text, option

__all__ = ["ExportOptions"]


@dataclass
class ExportOptions:
    """``bertattn export-onnx``: a BERT model as one ONNX file."""

    output: str = option(
        MISSING, "the .onnx file to write", flags=("-o", "--output"), required=True
    )
    model: str | None = option(
        None, "model folder, hub name, or a name bertattn get-model made (default all-MiniLM-L6-v2)"
    )
    opset: int | None = option(None, "ONNX opset (default: the exporter's default)", type=int)
    backend: str = option(
        "math",
        "attention backend traced into the graph (default math: fastest in ONNX Runtime)",
        choices=("math", "sdpa"),
    )
    quiet: bool = option(
        False,
        "no status line on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )
    device: str = option("auto", f"where the model is traced: {DEVICE_HELP} (default auto)")

    def __post_init__(self) -> None:
        cls = type(self)
        check_text(cls, self, "output", optional=False)
        check_device(cls, self)
        check_text(cls, self, "model")
        check_int(cls, self, "opset")
        check_choice(cls, self, "backend", ("math", "sdpa"))
        if str(self.output) == "-":
            raise UsageError(
                "--output -: an ONNX model is a binary file of tens of MB, not written to "
                "stdout; give a file name ending in .onnx."
            )
        # a folder or a wrong suffix: the job's check_output says which, in the words every
        # command uses
