"""The attend job: one text (or pair) in, its attention out: a text summary, the article's steps
for one head and token, or PNG / HTML / JSON files written all together or not at all."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..files import check_output
from ..maps import AttentionMaps
from .inputs import check_input
from .options import AttendOptions, flag, job_device

if TYPE_CHECKING:
    from ..bert.steps import AttentionSteps

__all__ = ["AttendResult", "read_text", "run_attend"]


@dataclass
class AttendResult:
    """The maps computed, the files written (in PNG, HTML, JSON order), the steps asked for
    with ``--explain``, and the warnings raised while computing (e.g. truncation)."""

    maps: AttentionMaps
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    steps: AttentionSteps | None = None
    stdout: bytes | None = None  # the output asked for as ``-`` (JSON or HTML), for stdout


def _check_range(name: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise UsageError(
            f"{flag(AttendOptions, name)} {value} is out of range: this model has {name}s "
            f"0..{count - 1}."
        )


def read_text(options: AttendOptions) -> str:
    """The text: as given, from stdin (``-``) or from ``--file`` (UTF-8; a final newline is
    not part of the text)."""
    if options.file is None and options.text != "-":
        return str(options.text)
    name = "<stdin>" if options.file is None else str(options.file)
    if options.file is None:
        raw = sys.stdin.buffer.read()
    else:
        raw = check_input(options.file, what="--file", stream=True).read_bytes()
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{name}: invalid UTF-8 at byte {exc.start}; convert the file to UTF-8 first."
        ) from None
    if not text.strip():
        raise UsageError(f"{name} holds no text; give the sentence whose attention you want.")
    return text


def run_attend(options: AttendOptions) -> AttendResult:
    """Compute the attention of the text and write the files asked for.

    Every output path, ``layer`` / ``head`` / ``max_length`` / ``--steps`` / ``--explain`` are
    checked before the model runs; the files are rendered first and written together
    (:func:`bertattn.files.write_all`).
    """
    from .. import viz
    from ..bert import Bert

    inputs = [] if options.file is None else [options.file]
    for path, kind in options.outputs:
        if path != "-":
            check_output(path, what=f"--{kind.lower()}", inputs=inputs)
    device = job_device(options.device)
    text = read_text(options)
    bert = Bert.load(options.model, device=device)
    cfg = bert.model.config
    _check_range("layer", options.layer or 0, cfg.num_hidden_layers)
    _check_range("head", options.head or 0, cfg.num_attention_heads)
    limit = cfg.max_position_embeddings
    if options.max_length is not None and options.max_length > limit:
        raise UsageError(
            f"--max-length {options.max_length} exceeds what the model takes "
            f"(max_position_embeddings {limit}); use --max-length {limit} or less."
        )
    qkv_layers = options.steps_layers(cfg.num_hidden_layers)
    target = None
    if options.explain is not None:
        layer, head, _ = target = options.explain_target()
        _check_range("layer", layer, cfg.num_hidden_layers)
        _check_range("head", head, cfg.num_attention_heads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = bert.attention_maps(
            text, options.pair, max_length=options.max_length, qkv_layers=qkv_layers
        )
    result = AttendResult(maps, warnings=[str(w.message) for w in caught])
    if target is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # truncation was reported above
            try:
                result.steps = bert.attention_steps(
                    text,
                    layer=target[0],
                    head=target[1],
                    query=target[2],
                    pair=options.pair,
                    max_length=options.max_length,
                )
            except ValueError as exc:
                raise UsageError(f"--explain {options.explain}: {exc}") from None
    files = {
        k: (None if p == "-" else p) for k, p in (("html", options.html), ("json", options.json))
    }
    if options.png or any(files.values()):
        result.written = viz.render_all(
            maps,
            png=options.png,
            html=files["html"],
            json_path=files["json"],
            layer=options.layer,
            head=options.head,
            rollout=options.rollout,
        )
    if "-" in (options.html, options.json):
        roll = viz.attention_rollout(maps) if options.rollout else None
        if options.json == "-":
            result.stdout = viz.render_json(maps, rollout=roll)
        else:
            page = viz.render_html(maps, rollout=roll, layer=options.layer, head=options.head)
            result.stdout = page.encode("utf-8")
    return result
