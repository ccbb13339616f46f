"""The machinery every job's options dataclass shares: fields that carry their command-line
spelling (parser, argv), the validators, and the settings more than one job takes."""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import MISSING, field, fields
from typing import Any

from .. import dtypes
from ..errors import UsageError
from ..serve_defaults import MAX_LENGTH_WHY  # the fewest tokens a text keeps, and why

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEVICE_HELP",
    "DTYPES",
    "ENCODER_DTYPES",
    "ENCODER_DTYPE_HELP",
    "DTYPE_HELP",
    "EMBEDDING_FORMATS",
    "GROUPS",
    "MAX_LENGTH_WHY",
    "add_arguments",
    "check_choice",
    "check_device",
    "check_dtype",
    "check_int",
    "check_seconds",
    "check_text",
    "check_unicode",
    "flag",
    "from_namespace",
    "job_device",
    "max_workers",
    "option",
    "parse_size",
    "to_argv",
    "world_size",
]

#: ``--dtype``'s choices (:mod:`bertattn.dtypes`); ``auto``: the machine's fastest
#: (:func:`bertattn.choose_dtype`: on the CPU timed once and cached, the flag rule as fallback;
#: bfloat16 on a GPU with bf16, else float16)
DTYPES = (*dtypes.COMMAND_LINE, dtypes.AUTO)
#: ``--dtype``'s help, after what the command says of it
DTYPE_HELP = (
    "auto: on the CPU bfloat16 where a timed probe (cached per CPU, torch and threads; "
    "BERTATTN_DTYPE_PROBE=0: the CPU's flags instead: AMX or Zen 4) finds it 1.1x faster, else "
    "float32; on a GPU bfloat16 (float16 without bf16); -v says why"
)
#: the sentence encoder's ``--dtype`` choices (encode, serve): also ``int8`` (CPU, opt-in: the
#: encoder's matrix products in int8, checked against float32 as the model loads)
ENCODER_DTYPES = (*DTYPES, dtypes.INT8)
ENCODER_DTYPE_HELP = DTYPE_HELP + "; int8: CPU only, checked against float32 as it loads"
EMBEDDING_FORMATS = (".npy", ".jsonl")
DEFAULT_TIMEOUT = 1800.0

#: ``--task``'s help (encode and serve): a folder's task adapters
TASK_HELP = (
    "the task adapter to merge as the model loads, for a folder that has them (Jina v3's: "
    "retrieval.query, retrieval.passage, separation, classification, text-matching; "
    "default: the base weights)"
)

#: argument groups of the parser: title -> description
GROUPS = {
    "distributed / resumable": (
        "Under torchrun (WORLD_SIZE > 1), with --workers, with --resumable or into a folder "
        "(-o OUT/) the input is cut into chunks written to OUTPUT.parts/ (or OUT/) as they "
        "finish; a rerun of the same command resumes. OUTPUT.parts/ is removed once OUTPUT is "
        "complete; OUT/ keeps one .npy shard per chunk and an index.json."
    ),
}


def option(default: Any, help: str, **cli: Any) -> Any:
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


# Validation happens on construction (``__post_init__``): types, ranges and combinations, without
# touching the filesystem or loading anything. What depends on the machine and the files (the
# number of CPUs, torchrun's environment, whether the output can be written) is checked by the
# job itself, still before any work. Every refusal is a UsageError whose message names the flag.
def check_int(
    cls: type, obj: object, name: str, *, low: int = 1, optional: bool = True, because: str = ""
) -> None:
    """Option ``name`` of ``obj`` is an integer >= ``low`` (None too when ``optional``)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        why = f" ({because})" if because and isinstance(value, int) else ""
        raise UsageError(f"{flag(cls, name)} must be an integer >= {low}, got {value!r}{why}.")


def check_choice(cls: type, obj: object, name: str, choices: tuple[str, ...]) -> None:
    """Option ``name`` of ``obj`` is one of ``choices`` (or None)."""
    value = getattr(obj, name)
    if value is not None and value not in choices:
        raise UsageError(f"{flag(cls, name)} {value!r} is not one of {', '.join(choices)}.")


def check_dtype(cls: type, obj: object, *, int8: bool = False) -> None:
    """``obj.dtype`` is a ``--dtype`` name (:data:`DTYPES`; :data:`ENCODER_DTYPES` with
    ``int8``), by :func:`bertattn.dtypes.parse_dtype`, the check the Python API makes."""
    where = flag(cls, "dtype")
    value = obj.dtype  # type: ignore[attr-defined]
    try:
        dtypes.parse_dtype(value, where=where, names=dtypes.COMMAND_LINE, auto="fastest",
                           int8=int8, exact=True)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def check_text(cls: type, obj: object, name: str, *, optional: bool = True) -> None:
    """Option ``name`` of ``obj`` is a non-empty path or name (None too when ``optional``)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise UsageError(f"{flag(cls, name)} must be a non-empty path or name, got {value!r}.")


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_unicode(cls: type, obj: object, *names: str) -> None:
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


_DEVICE = re.compile(r"\A(auto|cpu|cuda(:\d+)?)\Z")
DEVICE_HELP = "auto (CUDA when available, else the CPU), cpu, cuda or cuda:N"


def check_device(cls: type, obj: object) -> None:
    """``obj.device`` is a ``--device`` spelling (this machine having it: :func:`job_device`)."""
    value = obj.device  # type: ignore[attr-defined]
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise UsageError(f"--device {value!r} is not one of {DEVICE_HELP}.")


def job_device(spec: str):  # type: ignore[no-untyped-def]
    """``--device`` as a ``torch.device`` on this machine (``UsageError`` when it has no such
    device, e.g. ``cuda`` without CUDA)."""
    from ..encoder import resolve_device

    try:
        return resolve_device(spec)
    except ValueError as exc:
        raise UsageError(f"--device {spec}: {exc}") from None


def max_workers() -> int:
    """The most local ranks worth starting: one per GPU with CUDA, else one per CPU this
    process may use (affinity capped by a cgroup CPU quota:
    :func:`bertattn.runtime.threads.cpu_budget`)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    from ..runtime.threads import cpu_budget

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


def world_size() -> int:
    """torchrun's ``WORLD_SIZE`` (1 when unset or malformed)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "") or 1)
    except ValueError:
        return 1  # RankInfo.from_env reports the malformed value


def check_seconds(cls: type, obj: object, name: str) -> None:
    """Option ``name`` of ``obj`` is a finite number of seconds >= 0."""
    value = getattr(obj, name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise UsageError(f"{flag(cls, name)} must be a number of seconds >= 0, got {value!r}.")


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
