"""The attend job: one text (or pair) in, its attention out: a text summary, or PNG / HTML /
JSON files written all together or not at all."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..files import check_output
from ..maps import AttentionMaps
from .options import AttendOptions, flag

__all__ = ["AttendResult", "run_attend"]


@dataclass
class AttendResult:
    """The maps computed, the files written (in PNG, HTML, JSON order), and the warnings raised
    while computing (e.g. truncation), for the caller to report."""

    maps: AttentionMaps
    written: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _check_range(name: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise UsageError(
            f"{flag(AttendOptions, name)} {value} is out of range: this model has {name}s "
            f"0..{count - 1}."
        )


def run_attend(options: AttendOptions) -> AttendResult:
    """Compute ``options.text``'s attention and write the files asked for.

    Every output path and ``layer`` / ``head`` are checked before the model runs; the files
    are rendered first and written together (:func:`bertattn.files.write_all`).
    """
    from .. import viz
    from ..bert import Bert

    for path, kind in options.outputs:
        check_output(path, what=f"--{kind.lower()}")
    bert = Bert.load(options.model)
    cfg = bert.model.config
    _check_range("layer", options.layer, cfg.num_hidden_layers)
    _check_range("head", options.head, cfg.num_attention_heads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = bert.attention_maps(options.text, options.pair)
    result = AttendResult(maps, warnings=[str(w.message) for w in caught])
    if options.outputs:
        result.written = viz.render_all(
            maps,
            png=options.png,
            html=options.html,
            json_path=options.json,
            layer=options.layer,
            head=options.head,
            rollout=options.rollout,
        )
    return result
