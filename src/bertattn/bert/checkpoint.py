"""Checkpoints: the explicit key map (Hugging Face <-> bertattn), file reading, strict loading.

Never executes code from a model folder: weights come from ``model.safetensors`` or from
``pytorch_model.bin`` through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .config import BertConfig

if TYPE_CHECKING:
    from .model import BertModel

logger = logging.getLogger("bertattn.bert")

__all__ = [
    "hf_to_bertattn_keys",
    "bertattn_to_hf_keys",
    "read_state_dict",
    "remap_state_dict",
    "resolve_model_dir",
    "load_pretrained",
    "HEAD_PREFIXES",
]

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# task heads of BertFor* models: skipped (and reported) when loading the encoder
HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.", "pre_classifier.", "lm_head.")
# buffers some checkpoints carry that are not weights
IGNORED_BUFFERS = ("embeddings.position_ids",)

_GLOBAL = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
}
_PER_LAYER = {
    "attention.self.query": "attn.q_linear",
    "attention.self.key": "attn.k_linear",
    "attention.self.value": "attn.v_linear",
    "attention.output.dense": "attn.out_linear",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "mlp.fc_in",
    "output.dense": "mlp.fc_out",
    "output.LayerNorm": "mlp_norm",
}
_POOLER = {"pooler.dense.weight": "pooler.dense.weight", "pooler.dense.bias": "pooler.dense.bias"}


def hf_to_bertattn_keys(config: BertConfig, *, pooler: bool = True) -> dict[str, str]:
    """Every Hugging Face ``BertModel`` parameter name -> its bertattn name, for ``config``."""
    keys = dict(_GLOBAL)
    for i in range(config.num_hidden_layers):
        for hf, ours in _PER_LAYER.items():
            for p in ("weight", "bias"):
                keys[f"encoder.layer.{i}.{hf}.{p}"] = f"encoder.layers.{i}.{ours}.{p}"
    if pooler:
        keys.update(_POOLER)
    return keys


def bertattn_to_hf_keys(config: BertConfig, *, pooler: bool = True) -> dict[str, str]:
    """The inverse of :func:`hf_to_bertattn_keys` (bertattn name -> Hugging Face name)."""
    return {v: k for k, v in hf_to_bertattn_keys(config, pooler=pooler).items()}


# ---------------------------------------------------------------------- files
def weight_file(folder: Path) -> Path:
    """``model.safetensors`` if present, else ``pytorch_model.bin``."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    if any(folder.glob("*.safetensors.index.json")) or any(folder.glob("*.bin.index.json")):
        raise ValueError(f"{folder}: sharded checkpoints are not supported; found only an index.")
    raise FileNotFoundError(
        f"{folder}: no weights found; expected one of {', '.join(WEIGHT_FILES)}."
    )


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """Tensors of a ``.safetensors`` or ``.bin`` file; a corrupt file -> ValueError naming it."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors / pickle errors have no common base class
        raise ValueError(
            f"cannot read weights file {path}: {exc}. The file is truncated or corrupt; "
            f"download it again."
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"weights file {path} does not hold a flat dict of tensors.")
    return state


# ---------------------------------------------------------------------- remapping
def _canonical(name: str) -> str:
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
    prefixed = any(k.startswith("bert.") for k in state)
    encoder: dict[str, Tensor] = {}
    skipped: list[str] = []
    unexpected: list[str] = []
    for key, tensor in state.items():
        name = _canonical(key)
        if prefixed:
            if not name.startswith("bert."):
                (skipped if name.startswith(HEAD_PREFIXES) else unexpected).append(key)
                continue
            name = name[len("bert.") :]
        elif name.startswith(HEAD_PREFIXES):
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
        parts = []
        if missing:
            parts.append(f"missing tensors: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(sorted(unexpected))}")
        raise ValueError(
            f"{source} does not match a BertModel with {config.num_hidden_layers} layers "
            f"(config.json): {'; '.join(parts)}."
        )
    return {key_map[k]: v for k, v in encoder.items()}, skipped, has_pooler


# ---------------------------------------------------------------------- hub names
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_HUB_FILES = [
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "*/config.json",
]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # huggingface_hub's own default


def resolve_model_dir(path: str | Path) -> Path:
    """A local folder as it is; a hub name (``name`` or ``org/name``) from the Hugging Face cache
    (downloaded unless ``HF_HUB_OFFLINE`` is set), if ``huggingface_hub`` is installed."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise ValueError(f"{p} is a file; pass the model folder (with config.json) instead.")
    name = str(path)
    if not _HUB_NAME.match(name) or name.startswith((".", "~")):
        raise FileNotFoundError(f"model folder {p} does not exist.")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(
            f"model folder {p} does not exist; to load {name!r} from the Hugging Face hub, "
            f"install huggingface-hub (pip install huggingface-hub)."
        ) from None
    offline = _offline()
    cache = _hub_cache_dir()
    try:
        folder = snapshot_download(
            name, cache_dir=cache, local_files_only=offline, allow_patterns=_HUB_FILES
        )
    except Exception as exc:  # LocalEntryNotFoundError, RepositoryNotFoundError, HTTP errors
        where = cache or "the default Hugging Face cache"
        if offline:
            raise FileNotFoundError(
                f"model {name!r} is not a local folder and is not in the Hugging Face cache "
                f"({where}); HF_HUB_OFFLINE=1 forbids downloading it. Download it once with "
                f"network access, or pass the path of a model folder."
            ) from None
        raise FileNotFoundError(
            f"model {name!r} is not a local folder and could not be fetched from the Hugging "
            f"Face hub into {where}: {exc}"
        ) from None
    return Path(folder)


# ---------------------------------------------------------------------- loading
def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype {dtype!r} is not a floating-point torch dtype (e.g. 'float16').")
    return value


def load_pretrained(
    cls: type[BertModel],
    path: str | Path,
    *,
    dtype: torch.dtype | str | None = None,
    backend: str = "auto",
) -> BertModel:
    """Build ``cls`` from a Hugging Face BERT folder, strictly (see :func:`remap_state_dict`)."""
    target = resolve_dtype(dtype)
    folder = resolve_model_dir(path)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json; is this a Hugging Face model folder?")
    config = BertConfig.from_json_file(config_path)
    wfile = weight_file(folder)
    state, skipped, has_pooler = remap_state_dict(read_state_dict(wfile), config, source=str(wfile))
    if skipped:
        msg = f"{wfile}: skipped {len(skipped)} task-head tensors: {', '.join(sorted(skipped))}"
        logger.info("%s", msg)
        warnings.warn(msg, stacklevel=3)
    if not has_pooler:
        msg = f"{wfile}: no pooler weights (e.g. a BertForMaskedLM); pooler_output will be None"
        logger.info("%s", msg)
        warnings.warn(msg, stacklevel=3)

    with torch.device("meta"):
        model = cls(config, backend=backend, add_pooling_layer=has_pooler)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    bad = [
        f"{k} (file {tuple(v.shape)}, model {tuple(expected[k])})"
        for k, v in state.items()
        if v.shape != expected[k]
    ]
    if bad:
        inverse = bertattn_to_hf_keys(config, pooler=has_pooler)
        bad = [f"{inverse[b.split(' ')[0]]} -> {b}" for b in bad]
        raise ValueError(f"{wfile}: shape mismatch with config.json: {'; '.join(bad)}.")
    half = target in (torch.float16, torch.bfloat16)  # mixed precision: see to_compute_dtype
    state = {k: v.to(torch.float32 if half else target) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if half:
        model.to_compute_dtype(target)
    model.name_or_path = str(path)
    return model.eval()
