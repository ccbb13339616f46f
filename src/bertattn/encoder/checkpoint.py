"""Checkpoints: the explicit key map (Hugging Face <-> bertattn), file reading, strict loading.

Never executes code from a model folder: weights come from ``model.safetensors`` or from
``pytorch_model.bin`` through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..arguments import check_bool, check_str
from ..dtypes import parse_dtype
from ..errors import ModelFolderError
from ..families import registry
from ..families.bert import BERT_HEADS
from ..messages import listing
from .config import BertConfig, check_against_tensors
from .folder import WEIGHT_FILES, ModelFolder, locate_model, resolve_model, weight_file

if TYPE_CHECKING:
    from .model import BertModel

logger = logging.getLogger("bertattn.encoder")

__all__ = [
    "hf_to_bertattn_keys",
    "bertattn_to_hf_keys",
    "read_state_dict",
    "warn_not_finite",
    "remap_state_dict",
    "resolve_model_dir",
    "load_pretrained",
    "weight_file",
    "HEAD_PREFIXES",
    "WEIGHT_FILES",
]

#: the old name of :func:`bertattn.encoder.folder.locate_model` (where a path or hub name points,
#: not validated); new code calls :func:`bertattn.encoder.folder.resolve_model`
resolve_model_dir = locate_model
#: task heads of BertFor* models: skipped (and reported) when loading the encoder (each family
#: record has its own: :attr:`bertattn.families.registry.Family.head_prefixes`)
HEAD_PREFIXES = BERT_HEADS
# buffers some checkpoints carry that are not weights
IGNORED_BUFFERS = ("embeddings.position_ids",)


def hf_to_bertattn_keys(config: BertConfig, *, pooler: bool = True) -> dict[str, str]:
    """Every checkpoint parameter name (after the family's renaming, without the base model's
    prefix) -> its bertattn name, for ``config``: the family record's map."""
    return registry.get(config.family).key_map(config, pooler)


def bertattn_to_hf_keys(config: BertConfig, *, pooler: bool = True) -> dict[str, str]:
    """The inverse of :func:`hf_to_bertattn_keys` (bertattn name -> Hugging Face name)."""
    return registry.inverse(hf_to_bertattn_keys(config, pooler=pooler))


# ---------------------------------------------------------------------- files
def read_state_dict(path: Path) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` or ``.bin`` file; a corrupt file -> ValueError naming it."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors / pickle errors have no common base class
        raise ModelFolderError(
            f"cannot read weights file {path}: {_load_failure(exc)}. The file is truncated or "
            f"corrupt, or not a plain dict of tensors; download it again."
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ModelFolderError(f"weights file {path} does not hold a flat dict of tensors.")
    return state


def warn_not_finite(state: dict[str, Tensor], source: str) -> list[str]:
    """Warn (``warnings`` and the ``bertattn.encoder`` logger) when tensors of ``state`` hold NaN
    or infinite values, naming them: every output computed through one is NaN, and nothing
    else would say why. The names warned of (empty: all finite). One float32 sum a tensor;
    the elements are counted only in a tensor whose sum is not finite."""
    bad = []
    for name, tensor in state.items():
        if not tensor.is_floating_point() or torch.isfinite(tensor.sum(dtype=torch.float32)):
            continue
        count = int((~torch.isfinite(tensor)).sum())
        if count:  # else a sum that overflowed float32, of finite values
            bad.append(f"{name} ({count} of {tensor.numel()} values)")
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        msg = (
            f"{source}: NaN or infinite values in {len(bad)} of its {len(state)} tensors: "
            f"{shown}; every output computed through them will be NaN. The file is damaged or "
            f"the training diverged: download it again or use another checkpoint."
        )
        logger.warning("%s", msg)
        warnings.warn(msg, stacklevel=3)
    return bad


def _load_failure(exc: Exception) -> str:
    """What went wrong, short. torch.load's weights-only refusal is a paragraph whose advice
    (load with weights_only=False, file an issue) is wrong for a damaged file and unsafe for an
    unknown one: keep only the unpickler's reason."""
    text = str(exc)
    found = re.search(
        r"WeightsUnpickler error:\s*(.*?)\s*(?:Check the documentation|$)", text, re.S
    )
    if found and found.group(1).strip():
        return f"torch.load (weights only) refused it: {found.group(1).strip().rstrip('.')}"
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


# ---------------------------------------------------------------------- remapping
def canonical_name(name: str) -> str:
    """Legacy TF-era names: ``LayerNorm.gamma/beta`` -> ``LayerNorm.weight/bias``."""
    return re.sub(
        r"LayerNorm\.gamma$",
        "LayerNorm.weight",
        re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name),
    )


def remap_state_dict(
    state: dict[str, Tensor], config: BertConfig, *, source: str = "checkpoint"
) -> tuple[dict[str, Tensor], list[str], bool]:
    """Hugging Face names -> bertattn names, strictly.

    Returns ``(state, skipped_head_keys, has_pooler)``. Raises ``ValueError`` naming the keys
    for a missing tensor or an unexpected non-head key.
    """
    family = registry.get(config.family)
    state = family.rename(state, config)  # the family's names, canonical (families/)
    top, heads = family.prefix, family.head_prefixes
    prefixed = any(k.startswith(top) for k in state)
    encoder: dict[str, Tensor] = {}
    skipped: list[str] = []
    unexpected: list[str] = []
    for key, tensor in state.items():
        name = canonical_name(key)
        if prefixed:
            if not name.startswith(top):
                (skipped if name.startswith(heads) else unexpected).append(key)
                continue
            name = name[len(top) :]
        elif name.startswith(heads):
            skipped.append(key)
            continue
        if name in IGNORED_BUFFERS:
            continue
        encoder[name] = tensor

    has_pooler = any(k.startswith("pooler.") for k in encoder)
    key_map = hf_to_bertattn_keys(config, pooler=has_pooler)
    unexpected += [k for k in encoder if k not in key_map]
    missing = [k for k in key_map if k not in encoder]
    if missing or unexpected:
        found = listing(
            ("missing tensors: ", ", ".join(missing)),
            ("unexpected keys: ", ", ".join(sorted(unexpected))),
        )
        raise ModelFolderError(
            f"{source} does not match a {family.title} model with {config.num_hidden_layers} "
            f"layers (config.json): {found}."
        )
    return {key_map[k]: v for k, v in encoder.items()}, skipped, has_pooler


# ---------------------------------------------------------------------- loading
#: transformers' ``attn_implementation`` names -> bertattn backends
_ATTN_IMPLEMENTATIONS = {"sdpa": "sdpa", "eager": "math"}


def _is_hub_name(path: object) -> bool:
    """A string that is not an existing local path (so it resolves as a hub name)."""
    return isinstance(path, str) and not Path(path).expanduser().exists()


def _checkpoint_dtype(folder: Path) -> torch.dtype:
    """``dtype="auto"``'s ``"checkpoint"`` meaning (:mod:`bertattn.dtypes`): ``dtype``
    (transformers 5) or ``torch_dtype`` of ``folder/config.json``; float32 if neither is
    there."""
    import json

    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    value = raw.get("dtype") or raw.get("torch_dtype")
    where = f"{folder / 'config.json'}: dtype"
    return parse_dtype(value, where=where) if value else torch.float32  # type: ignore[return-value]


def _transformers_keywords(
    path: object,
    dtype: object,
    torch_dtype: object,
    backend: object,
    attn_implementation: object,
    revision: object,
    local_files_only: object,
) -> tuple[torch.dtype | str | None, str]:
    """``(dtype, backend)`` of :func:`load_pretrained`'s transformers keywords, checked:
    ``torch_dtype`` folded into ``dtype`` (``"auto"`` kept: the checkpoint's dtype),
    ``attn_implementation`` into ``backend``; a hub ``revision`` other than main, and a
    ``local_files_only`` that contradicts ``HF_HUB_OFFLINE``, refused."""
    dtype = parse_dtype(dtype, auto="checkpoint")
    torch_dtype = parse_dtype(torch_dtype, where="torch_dtype", auto="checkpoint")
    check_str(backend, "backend")
    check_str(attn_implementation, "attn_implementation", optional=True)
    check_str(revision, "revision", optional=True)
    check_bool(local_files_only, "local_files_only", optional=True)
    if torch_dtype is not None:
        if dtype is not None and dtype != torch_dtype:
            raise ValueError(
                f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; torch_dtype is an "
                f"alias of dtype, give one of them."
            )
        dtype = torch_dtype
    if attn_implementation is not None:
        if attn_implementation not in _ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"attn_implementation={attn_implementation!r} is not supported; use 'sdpa' or "
                f"'eager' (bertattn backends 'sdpa' / 'math'), or pass backend= with a "
                f"bertattn backend name."
            )
        mapped = _ATTN_IMPLEMENTATIONS[attn_implementation]
        if backend not in ("auto", mapped):
            raise ValueError(
                f"attn_implementation={attn_implementation!r} (backend {mapped!r}) contradicts "
                f"backend={backend!r}; give one of them."
            )
        backend = mapped
    if revision not in (None, "main"):
        raise ValueError(
            f"revision={revision!r} is not supported: bertattn loads the cached or local files "
            f"as they are. Download that revision (huggingface_hub.snapshot_download(name, "
            f"revision=...)) and pass its folder."
        )
    if local_files_only is not None and _is_hub_name(path):
        from .folder import hub_offline

        if local_files_only and not hub_offline():
            raise ValueError(
                f"local_files_only=True for hub name {str(path)!r}: bertattn reads hub names "
                f"from the cache only when HF_HUB_OFFLINE=1 is set; set it, or pass the folder."
            )
        if not local_files_only and hub_offline():
            raise ValueError(
                f"local_files_only=False for hub name {str(path)!r}, but HF_HUB_OFFLINE is set, "
                f"so bertattn reads hub names from the local cache only; unset HF_HUB_OFFLINE "
                f"to download."
            )
    return dtype, backend  # type: ignore[return-value]


def _check_shapes(
    model: BertModel, state: dict[str, Tensor], config: BertConfig, has_pooler: bool, wfile: Path
) -> None:
    """Every tensor of ``state`` (bertattn's names) has the shape ``model`` (built from
    config.json) expects; else ``ModelFolderError`` naming the first three, both ways, and a
    hidden size that config.json and the weights disagree on."""
    expected = {k: v.shape for k, v in model.state_dict().items()}
    bad = [
        f"{k} (file {tuple(v.shape)}, model {tuple(expected[k])})"
        for k, v in state.items()
        if v.shape != expected[k]
    ]
    if bad:
        inverse = bertattn_to_hf_keys(config, pooler=has_pooler)
        shown = [f"{inverse[b.split(' ')[0]]} -> {b}" for b in bad[:3]]
        if len(bad) > 3:
            shown.append(f"and {len(bad) - 3} more")
        words = state.get("embeddings.word.weight")
        wide = ""
        if words is not None and words.dim() == 2 and words.shape[1] != config.hidden_size:
            wide = (
                f" config.json says hidden_size={config.hidden_size}, the weights are "
                f"{words.shape[1]} wide."
            )
        raise ModelFolderError(
            f"{wfile}: {len(bad)} of {len(state)} tensors do not have the shapes config.json "
            f"gives ({'; '.join(shown)}).{wide} Use the config.json that came with these "
            f"weights."
        )


def load_pretrained(
    cls: type[BertModel],
    path: str | Path | ModelFolder | None,
    *,
    dtype: torch.dtype | str | None = None,
    torch_dtype: torch.dtype | str | None = None,
    backend: str = "auto",
    attn_implementation: str | None = None,
    revision: str | None = None,
    local_files_only: bool | None = None,
    task: str | None = None,
    **unsupported: object,
) -> BertModel:
    """Build ``cls`` from a model folder, strictly (see :func:`remap_state_dict`); this is
    :meth:`bertattn.BertModel.from_pretrained` (``cls`` the class it is called on). ``path``: a
    Hugging Face BERT folder, a sentence-transformers folder (its Transformer module is
    loaded), a cached hub name, a :class:`ModelFolder`, or None for the default model; see
    :func:`bertattn.encoder.folder.resolve_model`.

    transformers' keywords: ``torch_dtype`` is an alias of ``dtype``; ``dtype="auto"`` takes
    the checkpoint's ``dtype`` / ``torch_dtype`` from config.json (float32 if absent);
    ``attn_implementation`` ``"sdpa"`` / ``"eager"`` selects backend ``"sdpa"`` / ``"math"``;
    ``revision`` other than ``"main"`` is refused (bertattn does not pick hub revisions);
    ``local_files_only`` must agree with ``HF_HUB_OFFLINE`` for a hub name. ``task``: the task
    adapter merged into the weights, for a family whose folder has them (Jina v3's released
    folder); one the folder does not have, or a task for a family without adapters: ValueError
    naming them."""
    if unsupported:
        raise TypeError(
            f"from_pretrained() got unsupported keyword argument(s): "
            f"{', '.join(sorted(unsupported))}."
        )
    dtype, backend = _transformers_keywords(
        path, dtype, torch_dtype, backend, attn_implementation, revision, local_files_only
    )
    auto = isinstance(dtype, str) and dtype == "auto"
    target = torch.float32 if auto or dtype is None else dtype
    check_str(task, "task", optional=True)
    resolved = resolve_model(path)
    folder, config = resolved.model_dir, resolved.config
    if task is not None:  # a copy: the folder's own config stays the base weights'
        config = copy.copy(config)
        config.arch = registry.choose_task(
            config.family, config.arch, task, str(folder / "config.json")
        )
    if auto:
        target = _checkpoint_dtype(folder)
    wfile = weight_file(folder)
    raw = read_state_dict(wfile)
    warn_not_finite(raw, str(wfile))
    shapes = {k: tuple(v.shape) for k, v in raw.items()}
    check_against_tensors(  # before any module or key map is built from config.json's sizes
        config, shapes, config_source=str(folder / "config.json"), weights=str(wfile)
    )
    state, skipped, has_pooler = remap_state_dict(raw, config, source=str(wfile))
    if skipped:
        msg = f"{wfile}: skipped {len(skipped)} task-head tensors: {', '.join(sorted(skipped))}"
        logger.info("%s", msg)
        warnings.warn(msg, stacklevel=2)
    if not has_pooler and registry.get(config.family).pooler_expected:
        msg = f"{wfile}: no pooler weights (e.g. a BertForMaskedLM); pooler_output will be None"
        logger.info("%s", msg)
        warnings.warn(msg, stacklevel=2)

    with torch.device("meta"):
        model = cls(config, backend=backend, add_pooling_layer=has_pooler)
    _check_shapes(model, state, config, has_pooler, wfile)
    half = target in (torch.float16, torch.bfloat16)  # mixed precision: see to_compute_dtype
    state = {k: v.to(torch.float32 if half else target) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if half:
        model.to_compute_dtype(target)
    model.name_or_path = resolved.name
    model.task = task
    return model.eval()
