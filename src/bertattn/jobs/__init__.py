"""The application layer: the jobs the command line runs, usable from Python as they are.

Each job takes one options dataclass (validated on construction, see :mod:`.options`), checks
the machine, its inputs and its outputs before any work, picks the engine and writes its outputs
through :mod:`bertattn.files`. The CLI only parses arguments into these objects and reports.

    from bertattn.jobs import EncodeOptions, run_encode
    run_encode(EncodeOptions("texts.txt", "emb.npy", batch_size=64))
"""

from .attend import AttendResult, run_attend
from .encode import EncodeSummary, run_encode
from .export import run_export
from .heads import run_predict, run_rerank
from .inputs import read_texts
from .options import (
    AttendOptions,
    EncodeOptions,
    ExportOptions,
    PredictOptions,
    RerankOptions,
    ServeOptions,
)
from .serve import ServeResult, run_serve

__all__ = [
    "AttendOptions",
    "AttendResult",
    "EncodeOptions",
    "EncodeSummary",
    "ExportOptions",
    "PredictOptions",
    "RerankOptions",
    "ServeOptions",
    "ServeResult",
    "read_texts",
    "run_attend",
    "run_encode",
    "run_export",
    "run_predict",
    "run_rerank",
    "run_serve",
]
