"""``bertattn encode``'s options: :class:`EncodeOptions`, the settings a resumable run records
in its manifest (:meth:`EncodeOptions.settings`)."""

from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass, fields
from typing import Any

from ..choices import POOLINGS
from ..errors import UsageError
from ..runtime.threads import check_threads
from .fields import (
    DEFAULT_TIMEOUT,
    DEVICE_HELP,
    ENCODER_DTYPE_HELP,
    ENCODER_DTYPES,
    MAX_LENGTH_WHY,
    TASK_HELP,
    check_choice,
    check_device,
    check_dtype,
    check_int,
    check_text,
    check_unicode,
    flag,
    option,
    parse_size,
    world_size,
)
from .inputs import is_stream

__all__ = ["EncodeOptions"]


@dataclass
class EncodeOptions:
    """``bertattn encode``: embed every line of a file (one process, resumable chunks, N local
    ranks, or a torchrun rank; PyTorch or ONNX Runtime)."""

    input: str = option(
        MISSING,
        "text file (one text per line), .jsonl, a folder or a quoted glob of them (.gz / .zst "
        "too), or - for stdin (a pipe such as <(zcat f.gz) is read once, like stdin)",
        positional=True,
    )
    output: str = option(
        MISSING,
        "output .npy or .jsonl; a folder (ending in /) for one .npy shard per chunk and an "
        "index.json (read with bertattn.open_embeddings); - for JSON lines on stdout",
        flags=("-o", "--output"),
        required=True,
    )
    model: str | None = option(
        None, "model folder, hub name, or a name bertattn get-model made (default MiniLM)"
    )
    field: str | None = option(None, "JSON field holding the text (default text)")
    id_field: str | None = option(
        None, 'JSON field holding each record\'s id, copied into .jsonl output as "id"'
    )
    pooling: str | None = option(
        None, "pooling (default: as the model folder says)", choices=POOLINGS
    )
    normalize: bool | None = option(
        None, "L2-normalize the embeddings (default: as the model folder says)"
    )
    batch_size: int = option(
        32, "texts per batch (default 32; on the CPU short texts fill a batch further)", type=int
    )
    max_length: int | None = option(None, "tokens (default: the model's)", type=int)
    dtype: str = option(
        "float32",
        f"compute dtype (default float32; output float32; {ENCODER_DTYPE_HELP})",
        choices=ENCODER_DTYPES,
    )
    device: str = option(
        "auto", f"where the model runs: {DEVICE_HELP} (default auto)", output=False
    )
    threads: int | None = option(
        None,
        "CPU threads (default: the CPUs this process may use, affinity and cgroup quota, "
        "lowered while other processes hold cores; OMP_NUM_THREADS fixes it too)",
        type=int,
        metavar="N",
        output=False,
    )
    cuda_graphs: bool | None = option(
        None,
        "on CUDA, replay one captured CUDA graph per padded batch shape instead of launching "
        "every kernel (default: on with CUDA; --no-cuda-graphs runs every batch eagerly)",
        output=False,
    )
    compile: bool = option(
        False,
        "compile the encoder with torch.compile (inductor, frozen weights) as it loads: opt-in, "
        "a minute or more of compiling; where it cannot run a warning says why and it encodes "
        "eagerly",
        output=False,
    )
    task: str | None = option(None, TASK_HELP, metavar="TASK")
    onnx: str | None = option(
        None,
        "run this exported model (bertattn export-onnx) in ONNX Runtime; --model names the "
        "folder it came from (tokenizer, pooling)",
        metavar="MODEL.onnx",
    )
    sparse: bool | None = option(
        None,
        'write SPLADE sparse rows, JSON lines {"index", "id"?, "indices", "values"} '
        "(vocabulary ids ascending, their weights; .npy is refused). Default: on for a "
        "sentence-transformers SPLADE folder (SpladePooling); a plain BertForMaskedLM folder "
        "(SPLADE, or a plain BERT) needs --sparse; --no-sparse: dense embeddings of its encoder",
        output=False,  # a chunked run is always dense: its manifests need not record it
    )
    late_chunks: bool = option(
        False,
        'late chunking: JSON lines {"text", "spans": [[start, end], ...]} (character offsets), '
        "one row per span pooled from one forward of the whole text (overlapping windows past "
        '--max-length); .jsonl rows carry "record" and "span" (and "id" with --id-field)',
        output=False,
    )
    quiet: bool = option(
        False,
        "no progress bar and no summary line (warnings and errors still appear)",
        flags=("-q", "--quiet"),
        output=False,
    )
    progress: bool = option(
        False,
        "show the progress bar even when stderr is not a terminal (TQDM_DISABLE=1 hides it)",
        output=False,
    )
    workers: int | None = option(
        None,
        "run N local ranks (torchrun --standalone --nproc-per-node N); at most one per CPU core "
        "(one per GPU with CUDA)",
        type=int,
        metavar="N",
        group="distributed / resumable",
        output=False,
    )
    resumable: bool = option(
        False,
        "chunked and resumable even in one process",
        group="distributed / resumable",
        output=False,
    )
    restart: bool = option(
        False,
        "start over from an earlier run's chunks (OUTPUT.parts/, or OUT/), keeping those whose "
        "input bytes are unchanged when only the input changed; implies --resumable",
        group="distributed / resumable",
        output=False,
    )
    chunk_size: str | None = option(
        None,
        "input bytes per chunk: 512K, 16M, 1G, ... (default: total/256 within 64K..32M; a "
        "compressed file is one chunk); needs a chunked run",
        metavar="SIZE",
        group="distributed / resumable",
    )
    timeout: float | None = option(
        None,
        f"give up when no chunk finishes (or a collective waits) this long (default "
        f"{DEFAULT_TIMEOUT:.0f}); needs several ranks (--workers N or torchrun)",
        type=float,
        metavar="SECONDS",
        group="distributed / resumable",
        output=False,
    )

    def __post_init__(self) -> None:
        cls = type(self)
        check_text(cls, self, "input", optional=False)
        check_text(cls, self, "output", optional=False)
        for name in ("model", "onnx", "field", "id_field"):
            check_text(cls, self, name)
        if str(self.output) == "-" and (self.chunked or self.workers is not None):
            raise UsageError(
                "a chunked run (--workers, --resumable, --restart, torchrun) writes a file it can "
                "resume into; give -o FILE.npy or FILE.jsonl instead of -."
            )
        if self.id_field is not None and str(self.output).lower().endswith(".npy"):
            raise UsageError(
                "--id-field copies ids into .jsonl output; a .npy file holds only the numbers "
                "(rows in input order): write .jsonl, or drop --id-field."
            )
        check_unicode(cls, self, "field", "id_field")
        check_choice(cls, self, "pooling", POOLINGS)
        check_dtype(cls, self, int8=True)
        check_device(cls, self)
        check_int(cls, self, "batch_size", optional=False)
        check_int(cls, self, "max_length", low=3, because=MAX_LENGTH_WHY)
        check_int(cls, self, "workers")
        check_int(cls, self, "threads")
        check_threads(self.threads, flag(cls, "threads"))
        self.chunk_bytes  # noqa: B018  (parses --chunk-size)
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise UsageError(f"normalize must be True, False or None, got {self.normalize!r}.")
        if self.sparse is not None and not isinstance(self.sparse, bool):
            raise UsageError(f"sparse must be True, False or None, got {self.sparse!r}.")
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise UsageError(f"--timeout must be a number of seconds > 0, got {self.timeout!r}.")
        if self.late_chunks is not False:
            self._check_late_chunks()
        check_text(cls, self, "task")
        if self.onnx is not None:
            self._check_onnx()
        self._check_chunked_run()

    def _check_onnx(self) -> None:
        """An ``--onnx`` run: none of the options that apply to the PyTorch model only."""
        if self.task is not None:
            raise UsageError(
                "--task merges a task adapter as the PyTorch model loads; an --onnx model runs "
                "the weights it was exported with: drop --task, or drop --onnx."
            )
        if self.compile:
            raise UsageError(
                "--compile compiles the PyTorch model; an --onnx model runs in ONNX Runtime: "
                "drop --compile, or drop --onnx."
            )
        if self.dtype not in ("float32", "auto"):
            raise UsageError(
                f"--dtype {self.dtype} applies to the PyTorch model; an --onnx model runs in the "
                f"precision it was exported in (float32): drop --dtype, or drop --onnx."
            )
        if self.chunked or self.workers is not None:
            raise UsageError(
                f"--onnx runs in a single process and writes one file, so it cannot go with "
                f"{self._chunked_by()}; {self._unchunked_fix()}, or encode with the PyTorch "
                f"model (drop --onnx)."
            )

    def _check_chunked_run(self) -> None:
        """A chunked run reads a file, not a stream; ``--timeout`` and ``--chunk-size`` apply
        only to one."""
        cls = type(self)
        if (self.chunked or self.workers is not None) and is_stream(self.input):
            what = "stdin" if str(self.input) == "-" else f"{self.input} (a pipe or a device)"
            how = (
                "a sharded output (-o FOLDER/, written chunk by chunk)"
                if self.sharded
                else "a chunked run (--workers, --resumable, --restart, torchrun)"
            )
            fix = ", or write one .npy / .jsonl file" if self.sharded else ""
            raise UsageError(
                f"{how} cannot read {what}: every rank reads the input, and a rerun must find it "
                f"again; write it to a file first{fix}."
            )
        if self.timeout is not None and self.workers is None and world_size() <= 1:
            raise UsageError(
                "--timeout says how long a rank waits for the others (a chunk or a collective) "
                "before giving up; a single process has no other rank to wait for: drop "
                "--timeout, or add --workers N."
            )
        if not (self.chunked or self.workers is not None):
            given = [flag(cls, n) for n in ("chunk_size", "timeout") if getattr(self, n)]
            if given:
                verb = "apply" if len(given) > 1 else "applies"
                raise UsageError(
                    f"{' and '.join(given)} {verb} only to a chunked run; add --resumable (or "
                    f"--workers N), or drop {' and '.join(given)}."
                )

    def _check_late_chunks(self) -> None:
        """``--late-chunks`` runs in one process, on the PyTorch model, dense."""
        if not isinstance(self.late_chunks, bool):
            raise UsageError(f"late_chunks must be True or False, got {self.late_chunks!r}.")
        clash = [
            name
            for name, on in (
                ("--sparse", self.sparse is True),
                ("--onnx", self.onnx is not None),
                (self._chunked_by() if self.chunked or self.workers is not None else "", True),
            )
            if on and name
        ]
        if clash:
            raise UsageError(
                f"--late-chunks runs in one process on the PyTorch model and writes one file; "
                f"it cannot go with {', '.join(clash)}: drop "
                f"{'it' if len(clash) == 1 else 'them'}, or drop --late-chunks."
            )
        if self.id_field == "spans":
            raise UsageError(
                "--id-field spans names the field --late-chunks reads the spans from; give the "
                "records an id field of their own."
            )

    def _chunking_flags(self) -> list[str]:
        """The flags given that make this run chunked (or several ranks)."""
        given = ["--workers"] if self.workers is not None else []
        return given + [f"--{n}" for n in ("resumable", "restart") if getattr(self, n)]

    def _chunked_by(self) -> str:
        """What makes this run chunked, as the user gave it (for a message)."""
        given = self._chunking_flags()
        if self.sharded:
            given.append(f"a folder output (-o {self.output}: one .npy shard per chunk)")
        if world_size() > 1:
            given.append(f"torchrun (WORLD_SIZE={world_size()})")
        return " and ".join(given)

    def _unchunked_fix(self) -> str:
        """How to make this run one process writing one file (for a message)."""
        fixes = [f"drop {' and '.join(f)}"] if (f := self._chunking_flags()) else []
        if self.sharded:
            fixes.append("write one file (-o FILE.npy or FILE.jsonl)")
        if world_size() > 1:
            fixes.append("run it without torchrun")
        return ", ".join(fixes)

    @property
    def sharded(self) -> bool:
        """The output is a folder of shards: ``-o`` ends in ``/``."""
        return str(self.output).endswith(("/", os.sep))

    @property
    def chunked(self) -> bool:
        """This process encodes resumable chunks: ``--resumable`` / ``--restart``, a sharded
        output, or it is one rank of several (torchrun's ``WORLD_SIZE`` > 1)."""
        return self.resumable or self.restart or self.sharded or world_size() > 1

    @property
    def chunk_bytes(self) -> int | None:
        """``--chunk-size`` in bytes (None: automatic)."""
        return None if self.chunk_size is None else parse_size(self.chunk_size, "--chunk-size")

    @property
    def wait_seconds(self) -> float:
        return DEFAULT_TIMEOUT if self.timeout is None else float(self.timeout)

    def settings(self) -> dict[str, Any]:
        """The options that decide the output's values (recorded in a resumable manifest)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.metadata.get("output", True) and f.name not in ("input", "output", "model")
        }
