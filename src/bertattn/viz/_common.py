"""Shared helpers of the visualizers: argument checks and atomic file writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..maps import AttentionMaps

__all__ = ["check_layer_head", "layer_index", "write_atomic"]


def _range_text(ids: list[int]) -> str:
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(str(i) for i in ids)


def layer_index(maps: AttentionMaps, layer: int) -> int:
    """Position in ``maps.layers`` of the model's layer ``layer``.

    Raises ``ValueError`` starting with ``"layer N is out of range"`` and naming the valid ones
    (a CLI can prefix ``--`` to it).
    """
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int, got {type(layer).__name__}")
    if layer not in maps.layer_ids:
        raise ValueError(
            f"layer {layer} is out of range: this model has layers {_range_text(maps.layer_ids)}"
        )
    return maps.layer_ids.index(layer)


def check_layer_head(maps: AttentionMaps, layer: int, head: int) -> int:
    """Validate ``layer`` (a model layer id) and ``head``; return the layer's position."""
    idx = layer_index(maps, layer)
    if isinstance(head, bool) or not isinstance(head, int):
        raise TypeError(f"head must be an int, got {type(head).__name__}")
    if not 0 <= head < maps.num_heads:
        raise ValueError(
            f"head {head} is out of range: this model has heads 0..{maps.num_heads - 1}"
        )
    return idx


def write_atomic(path: str | os.PathLike[str], data: bytes, *, what: str = "file") -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    Readers never see a half-written file; on failure no temporary file is left behind and an
    ``OSError`` says what could not be written where, and why.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise OSError(f"cannot write the {what} to {path}: the folder {folder} does not exist")
    if path.is_dir():
        raise OSError(f"cannot write the {what} to {path}: it is a directory; give a file name")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OSError(f"cannot write the {what} to {path}: {e.strerror or e}") from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path
