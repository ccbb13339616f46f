"""A head's tensors, read strictly from a checkpoint: every expected name present with its
shape, nothing else beside the encoder (a tensor missing, unexpected or of another shape is
named in the error)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from ..encoder.checkpoint import HEAD_PREFIXES, canonical_name, read_state_dict
from ..errors import ModelFolderError
from ..messages import listing

__all__ = ["read_head"]


def _head_keys(keys: list[str]) -> list[str]:
    """The names of ``keys`` that are not the encoder's (under a family's base prefix,
    ``bert.``, ``model.``, ...: :func:`bertattn.families.registry.base_prefixes`; or bare)."""
    from ..families import registry

    prefixes = ("bert.", "roberta.", "electra.", "distilbert.", "mpnet.", *registry.base_prefixes())
    for family in prefixes:
        if any(k.startswith(family) for k in keys):
            return [k for k in keys if not k.startswith(family)]
    return [k for k in keys if k.startswith(HEAD_PREFIXES)]


def _read(path: Path, pooler: bool = False) -> dict[str, Tensor]:
    """The head tensors of ``path`` (safetensors: only those are read), legacy TF-era names
    (``LayerNorm.gamma`` / ``beta``) under today's (``weight`` / ``bias``); a classification
    head's ``classifier.dense`` / ``out_proj`` as ``pooler.dense`` / ``classifier``, the
    pooler left to the encoder unless ``pooler`` (ELECTRA's encoder has none: its head reads
    it)."""
    from ..families.bert import roberta_head_name

    found = {roberta_head_name(canonical_name(k), False): v for k, v in _read_raw(path).items()}
    return {k: v for k, v in found.items() if pooler or not k.startswith("pooler.")}


def _read_raw(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in _head_keys(list(f.keys()))}
        except (SafetensorError, OSError) as exc:
            raise ModelFolderError(f"cannot read weights file {path}: {exc}") from None
    state = read_state_dict(path)
    return {k: state[k] for k in _head_keys(list(state))}


def read_head(
    path: Path,
    expected: dict[str, tuple[int, ...]],
    what: str,
    optional: dict[str, tuple[int, ...]] | None = None,
    pooler: bool = False,
) -> dict[str, Tensor]:
    """The tensors ``expected`` (name -> shape) of ``path``, and those of ``optional`` that
    are there, float32; ``what``: the head's name for the message; ``pooler``: the head
    holds its own first-token layer (``pooler.dense.*``). Raises :class:`ModelFolderError`
    naming what is missing, unexpected or of another shape."""
    found = _read(path, pooler)
    shapes = {**(optional or {}), **expected}
    missing = [k for k in expected if k not in found]
    unexpected = sorted(k for k in found if k not in shapes)
    wrong = [
        f"{k} {tuple(found[k].shape)} (expected {shapes[k]})"
        for k in shapes
        if k in found and tuple(found[k].shape) != shapes[k]
    ]
    if missing or unexpected or wrong:
        found = listing(
            ("missing ", ", ".join(missing)),
            ("unexpected ", ", ".join(unexpected[:8])),
            ("other shapes: ", "; ".join(wrong)),
        )
        raise ModelFolderError(f"{path} does not hold the {what} config.json describes: {found}.")
    return {k: found[k].float() for k in shapes if k in found}
