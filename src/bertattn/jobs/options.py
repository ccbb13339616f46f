"""One options dataclass per job: the single list of a job's settings.

Each field carries its command-line spelling and help in its metadata, so the CLI builds its
parser from these classes (:func:`add_arguments`), the ``--workers`` launcher rebuilds a rank's
command line from an options object (:func:`to_argv`), and a resumable run records
:meth:`EncodeOptions.settings` in its manifest: the list is written once, here.

Validation happens on construction (``__post_init__``): types, ranges and combinations, without
touching the filesystem or loading anything. What depends on the machine and the files (the
number of CPUs, torchrun's environment, whether the output can be written) is checked by the job
itself, still before any work. Every refusal is a :class:`~bertattn.errors.UsageError` whose
message names the command-line flag.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .. import serve_defaults
from ..choices import AGGREGATIONS, FUNCTIONS, POOLINGS
from ..errors import UsageError
from ..files import overlapping
from ..threads import check_threads
from .inputs import is_stream

__all__ = [
    "DTYPES",
    "DEFAULT_TIMEOUT",
    "EMBEDDING_FORMATS",
    "AttendOptions",
    "EncodeOptions",
    "ExportOptions",
    "PredictOptions",
    "RerankOptions",
    "ServeOptions",
    "add_arguments",
    "flag",
    "job_device",
    "max_workers",
    "parse_size",
    "to_argv",
]

DTYPES = ("float32", "bfloat16", "float16")
EMBEDDING_FORMATS = (".npy", ".jsonl")
DEFAULT_TIMEOUT = 1800.0

#: argument groups of the parser: title -> description
GROUPS = {
    "distributed / resumable": (
        "Under torchrun (WORLD_SIZE > 1), with --workers, with --resumable or into a folder "
        "(-o OUT/) the input is cut into chunks written to OUTPUT.parts/ (or OUT/) as they "
        "finish; a rerun of the same command resumes. OUTPUT.parts/ is removed once OUTPUT is "
        "complete; OUT/ keeps one .npy shard per chunk and an index.json."
    ),
}


def _opt(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with its command-line spelling. ``cli`` keys: ``flags`` (default
    ``--name-with-dashes``), ``positional``, ``type``, ``choices``, ``metavar``, ``group``,
    ``required``, ``output`` (False: a setting that does not change the output)."""
    return field(default=default, metadata={"help": help, **cli})


def flag(cls: type, name: str) -> str:
    """The command-line spelling of option ``name`` of ``cls`` (for messages)."""
    meta = next(f.metadata for f in fields(cls) if f.name == name)
    if meta.get("positional"):
        return name.upper()
    return meta.get("flags", (f"--{name.replace('_', '-')}",))[-1]


def _int(
    cls: type, obj: object, name: str, *, low: int = 1, optional: bool = True, because: str = ""
) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        why = f" ({because})" if because and isinstance(value, int) else ""
        raise UsageError(f"{flag(cls, name)} must be an integer >= {low}, got {value!r}{why}.")


def _choice(cls: type, obj: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value is not None and value not in choices:
        raise UsageError(f"{flag(cls, name)} {value!r} is not one of {', '.join(choices)}.")


def _text(cls: type, obj: object, name: str, *, optional: bool = True) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise UsageError(f"{flag(cls, name)} must be a non-empty path or name, got {value!r}.")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(cls: type, obj: object, *names: str) -> None:
    """Text options that are valid Unicode: a command-line argument that is not valid UTF-8
    reaches Python as lone surrogates (``surrogateescape``), which no tokenizer, header or
    file takes. Refused naming the option, the byte and the fix."""
    for name in names:
        value = getattr(obj, name)
        found = _SURROGATE.search(value) if isinstance(value, str) else None
        if found is None:
            continue
        code = ord(found.group())
        what = f"byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise UsageError(
            f"{flag(cls, name)} is not valid UTF-8 ({what} at character {found.start()}); "
            f"give it in UTF-8 (check the terminal's encoding, LANG / LC_ALL)"
            + (", or put the text in a UTF-8 file and pass --file." if name == "text" else ".")
        )


#: the fewest tokens a text can keep: [CLS], one token, [SEP] (a pair: one more [SEP])
_MAX_LENGTH_WHY = "[CLS], [SEP] and at least one token of the text"

_DEVICE = re.compile(r"\A(auto|cpu|cuda(:\d+)?)\Z")
_DEVICE_HELP = "auto (CUDA when available, else the CPU), cpu, cuda or cuda:N"


def _device(cls: type, obj: object) -> None:
    value = obj.device  # type: ignore[attr-defined]
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise UsageError(f"--device {value!r} is not one of {_DEVICE_HELP}.")


def job_device(spec: str):  # type: ignore[no-untyped-def]
    """``--device`` as a ``torch.device`` on this machine (``UsageError`` when it has no such
    device, e.g. ``cuda`` without CUDA)."""
    from ..bert import resolve_device

    try:
        return resolve_device(spec)
    except ValueError as exc:
        raise UsageError(f"--device {spec}: {exc}") from None


def max_workers() -> int:
    """The most local ranks worth starting: one per GPU with CUDA, else one per CPU this
    process may use (affinity capped by a cgroup CPU quota: :func:`bertattn.threads.cpu_budget`)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    from ..threads import cpu_budget

    return cpu_budget().cpus


_SIZE = re.compile(r"\A\s*(\d+)\s*([kmgt]?)(i?b)?\s*\Z", re.IGNORECASE)


def parse_size(value: object, what: str) -> int:
    """``"512K"``, ``"16M"``, ``"1G"`` (binary units; a plain number is bytes) as bytes >= 1."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise UsageError(f"{what} must be a size like 512K, 16M or 1G, got {value!r}.")
    m = _SIZE.match(text)
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"{what} {value!r}: expected a size like 512K, 16M or 1G (bytes > 0).")
    return int(m.group(1)) << (10 * " kmgt".index((m.group(2) or " ").lower()))


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "") or 1)
    except ValueError:
        return 1  # RankInfo.from_env reports the malformed value


@dataclass
class EncodeOptions:
    """``bertattn encode``: embed every line of a file (one process, resumable chunks, N local
    ranks, or a torchrun rank; PyTorch or ONNX Runtime)."""

    input: str = _opt(
        MISSING,
        "text file (one text per line), .jsonl, a folder or a quoted glob of them (.gz / .zst "
        "too), or - for stdin (a pipe such as <(zcat f.gz) is read once, like stdin)",
        positional=True,
    )
    output: str = _opt(
        MISSING,
        "output .npy or .jsonl; a folder (ending in /) for one .npy shard per chunk and an "
        "index.json (read with bertattn.open_embeddings); - for JSON lines on stdout",
        flags=("-o", "--output"),
        required=True,
    )
    model: str | None = _opt(
        None, "model folder, hub name, or a name bertattn get-model made (default MiniLM)"
    )
    field: str | None = _opt(None, "JSON field holding the text (default text)")
    id_field: str | None = _opt(
        None, 'JSON field holding each record\'s id, copied into .jsonl output as "id"'
    )
    pooling: str | None = _opt(
        None, "pooling (default: as the model folder says)", choices=POOLINGS
    )
    normalize: bool | None = _opt(
        None, "L2-normalize the embeddings (default: as the model folder says)"
    )
    batch_size: int = _opt(32, "texts per batch (default 32)", type=int)
    max_length: int | None = _opt(None, "tokens (default: the model's)", type=int)
    dtype: str = _opt(
        "float32",
        "compute dtype (bfloat16: ~2x faster on CPUs with AVX512-BF16/AMX; output float32)",
        choices=DTYPES,
    )
    device: str = _opt("auto", f"where the model runs: {_DEVICE_HELP} (default auto)", output=False)
    threads: int | None = _opt(
        None,
        "CPU threads (default: the CPUs this process may use, affinity and cgroup quota, "
        "lowered while other processes hold cores; OMP_NUM_THREADS fixes it too)",
        type=int,
        metavar="N",
        output=False,
    )
    cuda_graphs: bool | None = _opt(
        None,
        "on CUDA, replay one captured CUDA graph per padded batch shape instead of launching "
        "every kernel (default: on with CUDA; --no-cuda-graphs runs every batch eagerly)",
        output=False,
    )
    onnx: str | None = _opt(
        None,
        "run this exported model (bertattn export-onnx) in ONNX Runtime; --model names the "
        "folder it came from (tokenizer, pooling)",
        metavar="MODEL.onnx",
    )
    sparse: bool | None = _opt(
        None,
        'write SPLADE sparse rows, JSON lines {"index", "id"?, "indices", "values"} '
        "(vocabulary ids ascending, their weights; .npy is refused). Default: on for a "
        "sentence-transformers SPLADE folder (SpladePooling); a plain BertForMaskedLM folder "
        "(SPLADE, or a plain BERT) needs --sparse; --no-sparse: dense embeddings of its encoder",
        output=False,  # a chunked run is always dense: its manifests need not record it
    )
    quiet: bool = _opt(
        False,
        "no progress bar and no summary line (warnings and errors still appear)",
        flags=("-q", "--quiet"),
        output=False,
    )
    progress: bool = _opt(
        False,
        "show the progress bar even when stderr is not a terminal (TQDM_DISABLE=1 hides it)",
        output=False,
    )
    workers: int | None = _opt(
        None,
        "run N local ranks (torchrun --standalone --nproc-per-node N); at most one per CPU core "
        "(one per GPU with CUDA)",
        type=int,
        metavar="N",
        group="distributed / resumable",
        output=False,
    )
    resumable: bool = _opt(
        False,
        "chunked and resumable even in one process",
        group="distributed / resumable",
        output=False,
    )
    restart: bool = _opt(
        False,
        "start over from an earlier run's chunks (OUTPUT.parts/, or OUT/), keeping those whose "
        "input bytes are unchanged when only the input changed; implies --resumable",
        group="distributed / resumable",
        output=False,
    )
    chunk_size: str | None = _opt(
        None,
        "input bytes per chunk: 512K, 16M, 1G, ... (default: total/256 within 64K..32M; a "
        "compressed file is one chunk); needs a chunked run",
        metavar="SIZE",
        group="distributed / resumable",
    )
    timeout: float | None = _opt(
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
        _text(cls, self, "input", optional=False)
        _text(cls, self, "output", optional=False)
        for name in ("model", "onnx", "field", "id_field"):
            _text(cls, self, name)
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
        _unicode(cls, self, "field", "id_field")
        _choice(cls, self, "pooling", POOLINGS)
        _choice(cls, self, "dtype", DTYPES)
        _device(cls, self)
        _int(cls, self, "batch_size", optional=False)
        _int(cls, self, "max_length", low=3, because=_MAX_LENGTH_WHY)
        _int(cls, self, "workers")
        _int(cls, self, "threads")
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
        if self.onnx is not None and self.dtype != "float32":
            raise UsageError(
                f"--dtype {self.dtype} applies to the PyTorch model; an --onnx model runs in the "
                f"precision it was exported in (float32): drop --dtype, or drop --onnx."
            )
        if self.onnx is not None and (self.chunked or self.workers is not None):
            raise UsageError(
                f"--onnx runs in a single process and writes one file, so it cannot go with "
                f"{self._chunked_by()}; {self._unchunked_fix()}, or encode with the PyTorch "
                f"model (drop --onnx)."
            )
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
        if self.timeout is not None and self.workers is None and _world_size() <= 1:
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

    def _chunking_flags(self) -> list[str]:
        """The flags given that make this run chunked (or several ranks)."""
        given = ["--workers"] if self.workers is not None else []
        return given + [f"--{n}" for n in ("resumable", "restart") if getattr(self, n)]

    def _chunked_by(self) -> str:
        """What makes this run chunked, as the user gave it (for a message)."""
        given = self._chunking_flags()
        if self.sharded:
            given.append(f"a folder output (-o {self.output}: one .npy shard per chunk)")
        if _world_size() > 1:
            given.append(f"torchrun (WORLD_SIZE={_world_size()})")
        return " and ".join(given)

    def _unchunked_fix(self) -> str:
        """How to make this run one process writing one file (for a message)."""
        fixes = [f"drop {' and '.join(f)}"] if (f := self._chunking_flags()) else []
        if self.sharded:
            fixes.append("write one file (-o FILE.npy or FILE.jsonl)")
        if _world_size() > 1:
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
        return self.resumable or self.restart or self.sharded or _world_size() > 1

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


@dataclass
class AttendOptions:
    """``bertattn attend``: one text (or pair) in, its attention out."""

    text: str | None = _opt(
        None,
        "the text to look at; - reads it from stdin (or use --file)",
        positional=True,
        nargs="?",
    )
    file: str | None = _opt(None, "read the text from this UTF-8 file instead", metavar="PATH")
    pair: str | None = _opt(None, "a second text (segment B of a pair)")
    model: str | None = _opt(
        None, "model folder, hub name, or a name bertattn get-model made (default MiniLM)"
    )
    device: str = _opt("auto", f"where the model runs: {_DEVICE_HELP} (default auto)")
    max_length: int | None = _opt(
        None,
        "tokens kept (default: the model folder's setting, 256 for MiniLM; at most the model's "
        "position limit, 512)",
        type=int,
    )
    layer: int | None = _opt(
        None,
        "layer shown large in the PNG, summarized, and opened in the page (default: 0; the "
        "page's own default view)",
        type=int,
    )
    head: int | None = _opt(
        None,
        "head shown large / summarized / the only head the page opens on (default: 0)",
        type=int,
    )
    png: str | None = _opt(None, "write a PNG (.png): every layer x head + one large")
    html: str | None = _opt(
        None, "write one self-contained interactive page (.html or .htm; - for stdout)"
    )
    json: str | None = _opt(None, "write the tokens and weights as JSON (.json; - for stdout)")
    rollout: bool = _opt(False, "add attention rollout to outputs")
    quiet: bool = _opt(
        False,
        "no status lines on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )
    explain: str | None = _opt(
        None,
        "print the article's steps (q·k, /√d, mask, softmax, Σ weights·v) for one head and one "
        "query token: LAYER:HEAD:TOKEN, TOKEN an index (0 is [CLS]) or the token's text (its "
        "first occurrence); its own layer and head, not --layer/--head",
        metavar="L:H:TOKEN",
    )
    steps: str | None = _opt(
        None,
        "layers whose q/k/v go into the page's step view: 0,2 or all (default: --layer)",
        metavar="LAYERS",
    )

    def __post_init__(self) -> None:
        cls = type(self)
        if self.text is not None and self.file is not None:
            raise UsageError("give the text or --file PATH, not both.")
        _unicode(cls, self, "text", "pair", "explain", "steps")
        if self.text is None and self.file is None:
            raise UsageError("no text: give TEXT, - to read stdin, or --file PATH.")
        if self.text is not None and (not isinstance(self.text, str) or not self.text.strip()):
            raise UsageError("TEXT is empty; give the sentence whose attention you want to see.")
        if self.pair is not None and (not isinstance(self.pair, str) or not self.pair.strip()):
            raise UsageError("--pair is empty; drop it or give a second sentence.")
        for name in ("model", "file"):
            _text(cls, self, name)
        _device(cls, self)
        _int(
            cls,
            self,
            "max_length",
            low=5 if self.pair is not None else 3,
            because=(
                "[CLS], [SEP], [SEP] and at least one token of each text of the pair"
                if self.pair is not None
                else _MAX_LENGTH_WHY
            ),
        )
        for name in ("layer", "head"):  # the range depends on the model: checked by the job
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"{flag(cls, name)} must be an integer, got {value!r}.")
        outputs = [str(p) for p in (self.png, self.html, self.json) if p is not None]
        for name in ("png", "html", "json"):
            _text(cls, self, name)
        twice = ("-", "-") if outputs.count("-") > 1 else overlapping(outputs)
        if twice is not None:
            raise UsageError(f"one file is named for two outputs ({twice[0]} and {twice[1]}).")
        if self.explain is not None and "-" in outputs:
            raise UsageError(
                "--explain prints the article's steps on stdout, where the output asked for as "
                "- would go too: write that output to a file, or run --explain on its own."
            )
        if self.png == "-":
            raise UsageError("--png - is not supported (a PNG is binary); give a file name.")
        if self.explain is not None:
            self._check_explain_layer_head()
        elif self.json is not None and self.png is None and self.html is None:
            given = [flag(cls, n) for n in ("layer", "head") if getattr(self, n) is not None]
            if given:  # the JSON holds every layer and head; nothing else is drawn
                raise UsageError(
                    f"{' and '.join(given)} {'do' if len(given) > 1 else 'does'} nothing "
                    f"with --json alone: the JSON holds every layer and head, and only --png, "
                    f"--html and the printed summary show one; drop {' and '.join(given)}, or "
                    f"add --png/--html."
                )
        if self.steps is not None:
            if self.html is None:
                raise UsageError("--steps chooses layers for the page's step view; add --html.")
            self.steps_layers(None)

    @property
    def outputs(self) -> list[tuple[str, str]]:
        """``(path, kind)`` of the files asked for."""
        return [
            (p, k)
            for p, k in ((self.png, "PNG"), (self.html, "HTML"), (self.json, "JSON"))
            if p is not None
        ]

    def _check_explain_layer_head(self) -> None:
        """``--explain`` has its own layer and head; ``--layer`` / ``--head`` choose the picture
        (PNG, page). With no picture they would do nothing: refused when they differ."""
        layer, head, _ = self.explain_target()
        if self.png is not None or self.html is not None:
            return
        cls = type(self)
        given = [
            (name, value)
            for name, value, own in (("layer", self.layer, layer), ("head", self.head, head))
            if value is not None and value != own
        ]
        if not given:
            return
        token = str(self.explain).split(":", 2)[2]
        named = " and ".join(f"{flag(cls, name)} {value}" for name, value in given)
        wanted = dict(given)
        raise UsageError(
            f"{named} {'do' if len(given) > 1 else 'does'} nothing here: --explain {self.explain} "
            f"explains its own layer {layer}, head {head}, and only --png and --html draw "
            f"--layer/--head. Put them in --explain (--explain {wanted.get('layer', layer)}:"
            f"{wanted.get('head', head)}:{token}), drop them, or add --png/--html for a picture."
        )

    def explain_target(self) -> tuple[int, int, int | str]:
        """``--explain LAYER:HEAD:TOKEN`` as ``(layer, head, token)`` (token: index or text)."""
        parts = str(self.explain).split(":", 2)
        try:
            if len(parts) != 3 or not parts[2]:
                raise ValueError
            layer, head = int(parts[0]), int(parts[1])
        except ValueError:
            raise UsageError(
                f"--explain {self.explain!r}: expected LAYER:HEAD:TOKEN, e.g. 2:0:it or 2:0:5."
            ) from None
        token = parts[2]
        return layer, head, int(token) if token.lstrip("-").isdigit() else token

    def steps_layers(self, num_layers: int | None) -> list[int]:
        """The layers whose q/k/v the page embeds (``num_layers`` checks the range)."""
        if self.html is None:
            return []
        if self.steps is None:
            chosen = [self.layer or 0]
        elif self.steps.strip().lower() == "all":
            chosen = list(range(num_layers or 0))
        else:
            try:
                chosen = sorted({int(x) for x in self.steps.split(",") if x.strip()})
            except ValueError:
                raise UsageError(
                    f"--steps {self.steps!r}: expected layer numbers like 0,2 or all."
                ) from None
            if not chosen:
                raise UsageError("--steps is empty; give layer numbers like 0,2 or all.")
        if num_layers is not None:
            bad = [i for i in chosen if not 0 <= i < num_layers]
            if bad:
                raise UsageError(
                    f"--steps {bad[0]} is out of range: this model has layers 0..{num_layers - 1}."
                )
        return chosen


@dataclass
class ExportOptions:
    """``bertattn export-onnx``: a BERT model as one ONNX file."""

    output: str = _opt(MISSING, "the .onnx file to write", flags=("-o", "--output"), required=True)
    model: str | None = _opt(
        None, "model folder, hub name, or a name bertattn get-model made (default all-MiniLM-L6-v2)"
    )
    opset: int | None = _opt(None, "ONNX opset (default: the exporter's default)", type=int)
    backend: str = _opt(
        "math",
        "attention backend traced into the graph (default math: fastest in ONNX Runtime)",
        choices=("math", "sdpa"),
    )
    quiet: bool = _opt(
        False,
        "no status line on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )
    device: str = _opt("auto", f"where the model is traced: {_DEVICE_HELP} (default auto)")

    def __post_init__(self) -> None:
        cls = type(self)
        _text(cls, self, "output", optional=False)
        _device(cls, self)
        _text(cls, self, "model")
        _int(cls, self, "opset")
        _choice(cls, self, "backend", ("math", "sdpa"))
        if str(self.output) == "-":
            raise UsageError(
                "--output -: an ONNX model is a binary file of tens of MB, not written to "
                "stdout; give a file name ending in .onnx."
            )
        # a folder or a wrong suffix: the job's check_output says which, in the words every
        # command uses


#: ``bertattn serve`` defaults (tokens, inputs, bytes, seconds); those the library's
#: :class:`bertattn.serve.Limits` also has come from :mod:`bertattn.serve_defaults`
SERVE_BATCH_TOKENS = serve_defaults.MAX_BATCH_TOKENS
SERVE_QUEUE_TOKENS = serve_defaults.MAX_QUEUE_TOKENS
SERVE_REQUEST_INPUTS = serve_defaults.MAX_REQUEST_INPUTS
SERVE_BODY_SIZE = f"{serve_defaults.MAX_BODY_MIB}M"
SERVE_DRAIN_TIMEOUT = 30.0
SERVE_QUEUE_TIME = serve_defaults.MAX_QUEUE_S
SERVE_MIN_QUEUE_REQUESTS = serve_defaults.MIN_QUEUE_REQUESTS
SERVE_HEADER_TIMEOUT = 10.0
SERVE_MAX_CONNECTIONS = 1024


def _seconds(cls: type, obj: object, name: str) -> None:
    value = getattr(obj, name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise UsageError(f"{flag(cls, name)} must be a number of seconds >= 0, got {value!r}.")


@dataclass
class ServeOptions:
    """``bertattn serve``: sentence embeddings over HTTP (OpenAI's /v1/embeddings, TEI's /embed)."""

    model: str | None = _opt(
        None,
        "model folder or hub name (default MiniLM); give it again to serve several models in "
        "one process (an embedder and a reranker: each request goes to the model its body "
        "names, or to the one that answers its route)",
        action="append",
    )
    device: str = _opt("auto", f"where the model runs: {_DEVICE_HELP} (default auto)")
    dtype: str = _opt("float32", "compute dtype (responses are float32)", choices=DTYPES)
    served_model_name: str | None = _opt(
        None,
        "the model name responses carry and requests may give (default: the hub name, e.g. "
        "sentence-transformers/all-MiniLM-L6-v2, or the folder's name; those stay accepted)",
        metavar="NAME",
    )
    host: str = _opt(
        "127.0.0.1",
        "address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every "
        "interface: set --api-key then)",
    )
    port: int = _opt(8080, "TCP port (default 8080; 0: any free port, printed)", type=int)
    threads: int | None = _opt(
        None,
        "CPU threads (default: the CPUs this process may use, lowered while other processes "
        "hold cores)",
        type=int,
        metavar="N",
    )
    max_batch_tokens: int = _opt(
        SERVE_BATCH_TOKENS,
        f"real tokens per model batch (default {SERVE_BATCH_TOKENS}); a larger request is "
        f"split across batches",
        type=int,
        metavar="N",
    )
    max_queue_tokens: int = _opt(
        SERVE_QUEUE_TOKENS,
        f"tokens waiting for the model before new requests get 429 + Retry-After (default "
        f"{SERVE_QUEUE_TOKENS})",
        type=int,
        metavar="N",
    )
    max_queue_time: float = _opt(
        SERVE_QUEUE_TIME,
        f"seconds of work (at the measured speed) that may wait before new requests get 429: "
        f"an admitted request waits about this long at most (default {SERVE_QUEUE_TIME:g}; "
        f"0: only --max-queue-tokens)",
        type=float,
        metavar="SECONDS",
    )
    min_queue_requests: int = _opt(
        SERVE_MIN_QUEUE_REQUESTS,
        f"while fewer requests than this wait, --max-queue-time does not refuse a new one "
        f"(--max-queue-tokens still does), so a burst of small requests gets in (default "
        f"{SERVE_MIN_QUEUE_REQUESTS}; 0: the time cap alone)",
        type=int,
        metavar="N",
    )
    max_request_inputs: int = _opt(
        SERVE_REQUEST_INPUTS,
        f"inputs in one request (default {SERVE_REQUEST_INPUTS})",
        type=int,
        metavar="N",
    )
    max_input_tokens: int | None = _opt(
        None,
        "tokens per input, [CLS] and [SEP] included (default: the model's max length)",
        type=int,
        metavar="N",
    )
    truncate: bool | None = _opt(
        None,
        "cut a longer input to --max-input-tokens (default); --no-truncate answers 400 naming "
        "the input instead",
    )
    sparse: bool = _opt(
        False,
        "serve a plain BertForMaskedLM folder as SPLADE (POST /embed_sparse); a "
        "sentence-transformers folder with SpladePooling is served so without it",
    )
    max_body_size: str = _opt(
        SERVE_BODY_SIZE,
        f"largest request body: 512K, 16M, ... (default {SERVE_BODY_SIZE}); larger gets 413",
        metavar="SIZE",
    )
    api_key: str | None = _opt(
        None,
        "require 'Authorization: Bearer KEY' on the data routes and /info (default: "
        "$BERTATTN_API_KEY; none: open). Probes and /metrics stay open",
        metavar="KEY",
    )
    drain_timeout: float = _opt(
        SERVE_DRAIN_TIMEOUT,
        f"on SIGTERM / Ctrl-C, seconds to finish the requests in flight (default "
        f"{SERVE_DRAIN_TIMEOUT:.0f}); /ready answers 503 meanwhile",
        type=float,
        metavar="SECONDS",
    )
    header_timeout: float = _opt(
        SERVE_HEADER_TIMEOUT,
        f"seconds a connection may take to send a request's headers, counted from when it "
        f"opens or its last answer (default {SERVE_HEADER_TIMEOUT:g}); then it is closed (408 "
        f"when part of a request came)",
        type=float,
        metavar="SECONDS",
    )
    max_connections: int | None = _opt(
        None,
        f"open connections at most; more get 503 and are closed (default "
        f"{SERVE_MAX_CONNECTIONS}, lowered to the open-file limit less 64)",
        type=int,
        metavar="N",
    )
    one_worker: bool = _opt(
        False,
        "with several --model: run their batches one at a time on one worker, in the order "
        "they were formed (default: a worker per model)",
    )
    quiet: bool = _opt(
        False,
        "no start-up and shut-down lines on stderr (warnings and errors still appear)",
        flags=("-q", "--quiet"),
    )

    def __post_init__(self) -> None:
        cls = type(self)
        given = self.model
        many = isinstance(given, (list, tuple))
        #: every --model, in order (``model`` is the first)
        self.models: tuple[str, ...] = tuple(given) if many else (() if given is None else (given,))
        self.model = self.models[0] if self.models else None
        for one in self.models:
            if not isinstance(one, (str, os.PathLike)) or not str(one).strip():
                raise UsageError(f"--model must be a non-empty path or name, got {one!r}.")
        if self.one_worker and len(self.models) < 2:
            raise UsageError(
                "--one-worker shares one worker between several models; give --model more "
                "than once, or drop --one-worker."
            )
        if len(self.models) > 1 and self.served_model_name is not None:
            raise UsageError(
                "--served-model-name names one model; with several --model each is served "
                "under its own names (the folder's name and path, or the hub name)."
            )
        _text(cls, self, "served_model_name")
        _unicode(cls, self, "served_model_name", "host", "api_key")
        _device(cls, self)
        _choice(cls, self, "dtype", DTYPES)
        if not isinstance(self.host, str) or not self.host.strip() or " " in self.host:
            raise UsageError(f"--host must be an address such as 127.0.0.1, got {self.host!r}.")
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise UsageError(f"--port must be an integer in 0..65535, got {port!r}.")
        _int(cls, self, "threads")
        check_threads(self.threads, flag(cls, "threads"))
        _int(cls, self, "max_batch_tokens", optional=False)
        _int(cls, self, "max_queue_tokens", optional=False)
        _int(cls, self, "max_request_inputs", optional=False)
        _int(cls, self, "max_input_tokens", low=3, because=_MAX_LENGTH_WHY)
        if self.max_queue_tokens < self.max_batch_tokens:
            raise UsageError(
                f"--max-queue-tokens {self.max_queue_tokens} is less than --max-batch-tokens "
                f"{self.max_batch_tokens}: the queue could never fill one batch; raise "
                f"--max-queue-tokens or lower --max-batch-tokens."
            )
        if self.max_input_tokens is not None and self.max_input_tokens > self.max_batch_tokens:
            raise UsageError(
                f"--max-input-tokens {self.max_input_tokens} is more than --max-batch-tokens "
                f"{self.max_batch_tokens}: one input must fit in a batch."
            )
        if self.truncate is not None and not isinstance(self.truncate, bool):
            raise UsageError(f"truncate must be True, False or None, got {self.truncate!r}.")
        self.max_body_bytes  # noqa: B018  (parses --max-body-size)
        if self.api_key is not None and (
            not isinstance(self.api_key, str) or not self.api_key.strip()
        ):
            raise UsageError("--api-key is empty; give a key, or drop --api-key.")
        _seconds(cls, self, "drain_timeout")
        _seconds(cls, self, "max_queue_time")
        _int(cls, self, "min_queue_requests", low=0, optional=False)
        _seconds(cls, self, "header_timeout")
        if self.header_timeout == 0:
            raise UsageError("--header-timeout must be a number of seconds > 0, got 0.")
        _int(cls, self, "max_connections")

    @property
    def max_body_bytes(self) -> int:
        """``--max-body-size`` in bytes."""
        return parse_size(self.max_body_size, "--max-body-size")


# ---------------------------------------------------------------------- the heads
HEAD_OUTPUTS = (".jsonl",)


def _head_common(cls: type, obj: Any) -> None:
    """What :class:`RerankOptions` and :class:`PredictOptions` check alike."""
    _text(cls, obj, "input", optional=False)
    _text(cls, obj, "output", optional=False)
    _text(cls, obj, "model", optional=False)
    _text(cls, obj, "field")
    _device(cls, obj)
    _choice(cls, obj, "dtype", DTYPES)
    _int(cls, obj, "batch_size", optional=False)
    _int(cls, obj, "max_length", low=3, because=_MAX_LENGTH_WHY)
    _int(cls, obj, "threads")
    _int(cls, obj, "top_k")
    out = str(obj.output)
    if out != "-" and not out.lower().endswith(HEAD_OUTPUTS):
        raise UsageError(
            f"--output {out}: {cls.__name__.removesuffix('Options').lower()} writes JSON lines; "
            f"name the file .jsonl, or write - for stdout."
        )


_HEAD_INPUT = (
    "one text per line of a UTF-8 file, or a .jsonl file (--field names the text; default "
    "text); - for stdin"
)


_RUN = "running the model"


@dataclass(kw_only=True)
class _HeadRun:
    """How a head job runs its model: the options :class:`RerankOptions` and
    :class:`PredictOptions` share."""

    batch_size: int = _opt(
        32, "inputs per batch (rerank: query-document pairs; default 32)", type=int, group=_RUN
    )
    max_length: int | None = _opt(
        None, "tokens per input, a pair's together (default: the model's)", type=int, group=_RUN
    )
    dtype: str = _opt("float32", "compute dtype", choices=DTYPES, group=_RUN)
    device: str = _opt("auto", f"where the model runs: {_DEVICE_HELP} (default auto)", group=_RUN)
    threads: int | None = _opt(
        None, "CPU threads (default: automatic)", type=int, metavar="N", group=_RUN
    )
    quiet: bool = _opt(False, "no summary line on stderr", flags=("-q", "--quiet"), group=_RUN)


@dataclass
class RerankOptions(_HeadRun):
    """``bertattn rerank``: documents ranked for a query by a one-label cross-encoder."""

    query: str = _opt(
        MISSING, "the query the documents are ranked for", positional=True, metavar="QUERY"
    )
    input: str = _opt(
        MISSING,
        f"the documents: {_HEAD_INPUT}",
        flags=("-i", "--input"),
        required=True,
        metavar="DOCS",
    )
    model: str = _opt(
        MISSING,
        "a BertForSequenceClassification folder with one label (a reranker), or a cached hub name",
        required=True,
        metavar="FOLDER",
    )
    output: str = _opt(
        "-",
        "JSON lines, best first, as bertattn.CrossEncoder.rank returns them: "
        '{"corpus_id": the document\'s 0-based record number, "id" (with --id-field), '
        '"score", "text" (with --return-documents)} (default -: stdout)',
        flags=("-o", "--output"),
        metavar="OUT.jsonl",
    )
    field: str | None = _opt(None, "JSON field holding each document (default text)")
    id_field: str | None = _opt(
        None, 'JSON field holding each document\'s id, copied into the output as "id"'
    )
    top_k: int | None = _opt(None, "write the best K documents only (default: all)", type=int,
                             metavar="K")  # fmt: skip
    max_tokens_per_doc: int | None = _opt(
        None,
        "score a longer document in overlapping windows of N of its tokens and keep its best "
        "window (default: cut each query + document pair at the model's max length)",
        type=int,
        metavar="N",
    )
    return_documents: bool = _opt(False, 'include each document as "text"')

    def __post_init__(self) -> None:
        cls = type(self)
        if not isinstance(self.query, str) or not self.query.strip():
            raise UsageError("QUERY is empty; give the text the documents are ranked for.")
        _head_common(cls, self)
        _text(cls, self, "id_field")
        _int(cls, self, "max_tokens_per_doc")


@dataclass
class PredictOptions(_HeadRun):
    """``bertattn predict``: what a model's head says of each input, as bertattn.pipeline."""

    input: str = _opt(
        MISSING,
        f"the inputs: {_HEAD_INPUT}; for a sequence classifier a JSON line may carry "
        f'"text_pair" too (a text pair); for a masked LM each text holds [MASK]',
        flags=("-i", "--input"),
        required=True,
        metavar="TEXTS",
    )
    model: str = _opt(
        MISSING,
        "a BertForSequenceClassification (text-classification), BertForTokenClassification "
        "(token-classification) or BertForMaskedLM (fill-mask) folder, or a cached hub name",
        required=True,
        metavar="FOLDER",
    )
    output: str = _opt(
        "-",
        "JSON lines, one per input, each the answer of bertattn.pipeline (transformers' "
        'dictionaries): {"label", "score"} (a list of them with --top-k), the entities '
        '[{"entity" or "entity_group", "score", "word", "start", "end", ...}], or the '
        'fill-mask proposals [{"score", "token", "token_str", "sequence"}] (default -: stdout)',
        flags=("-o", "--output"),
        metavar="OUT.jsonl",
    )
    field: str | None = _opt(None, "JSON field holding each text (default text)")
    top_k: int | None = _opt(
        None,
        "a classifier: the best K labels as a list per input (default: the best one, not in a "
        "list); fill-mask: K proposals per [MASK] (default 5)",
        type=int,
        metavar="K",
    )
    function_to_apply: str | None = _opt(
        None,
        "a sequence classifier's scores: sigmoid, softmax or none (default: as transformers, "
        "from the model's problem_type and labels)",
        choices=FUNCTIONS,
    )
    aggregation_strategy: str | None = _opt(
        None,
        "a token classifier's entities: none (one per token, the default), simple, first, "
        "average or max (tokens grouped into words and entities)",
        choices=AGGREGATIONS,
    )

    def __post_init__(self) -> None:
        cls = type(self)
        _head_common(cls, self)
        _choice(cls, self, "function_to_apply", FUNCTIONS)
        _choice(cls, self, "aggregation_strategy", AGGREGATIONS)


# ---------------------------------------------------------------------- the command line
def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one argument per field of the options class ``cls`` (its metadata says how)."""
    groups: dict[str, Any] = {}
    for f in fields(cls):
        meta = f.metadata
        target: Any = parser
        if "group" in meta:
            title = meta["group"]
            if title not in groups:
                groups[title] = parser.add_argument_group(title, GROUPS.get(title))
            target = groups[title]
        kwargs: dict[str, Any] = {"help": meta["help"]}
        if meta.get("positional"):
            if "nargs" in meta:
                kwargs.update(nargs=meta["nargs"], default=None)
            if "metavar" in meta:
                kwargs["metavar"] = meta["metavar"]
            target.add_argument(f.name, **kwargs)
            continue
        names = meta.get("flags", (f"--{f.name.replace('_', '-')}",))
        kwargs["dest"] = f.name
        kwargs["default"] = None if f.default is MISSING else f.default
        if "action" in meta:
            kwargs["action"] = meta["action"]
        elif f.type in ("bool", bool):
            kwargs["action"] = "store_true"
        elif f.type in ("bool | None",):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            for key in ("type", "choices", "metavar", "required"):
                if key in meta:
                    kwargs[key] = meta[key]
        target.add_argument(*names, **kwargs)


def from_namespace(cls: type, args: argparse.Namespace) -> Any:
    """The options object of ``cls`` from a parsed namespace (validated on construction)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def to_argv(options: Any, *, drop: tuple[str, ...] = (), **override: Any) -> list[str]:
    """The command-line arguments that rebuild ``options`` (minus ``drop``, with ``override``)."""
    argv: list[str] = []
    for f in fields(options):
        if f.name in drop:
            continue
        value = override.get(f.name, getattr(options, f.name))
        meta = f.metadata
        if meta.get("positional"):
            if value is not None:
                argv.insert(0, str(value))
            continue
        name = meta.get("flags", (f"--{f.name.replace('_', '-')}",))[-1]
        if f.type in ("bool", bool):
            argv += [name] if value else []
        elif f.type in ("bool | None",):
            argv += [] if value is None else [name if value else "--no-" + name[2:]]
        elif value is not None:
            argv += [name, str(value)]
    return argv
