"""The application layer: the jobs the command line runs, usable from Python as they are.

Each job takes one options dataclass, beside it in ``<job>_options`` (validated on construction;
the machinery they share is :mod:`.fields`), checks the machine, its inputs and its outputs
before any work, picks the engine and writes its outputs through :mod:`bertattn.files`. The CLI
only parses arguments into these objects and reports.

    from bertattn.jobs import EncodeOptions, run_encode
    run_encode(EncodeOptions("texts.txt", "emb.npy", batch_size=64))
"""

from .attend import AttendResult, run_attend
from .attend_options import AttendOptions
from .encode import EncodeSummary, run_encode
from .encode_options import EncodeOptions
from .export import run_export
from .export_options import ExportOptions
from .head_options import PredictOptions, RerankOptions
from .heads import run_predict, run_rerank
from .inputs import read_texts
from .serve import ServeResult, run_serve
from .serve_options import ServeOptions

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
