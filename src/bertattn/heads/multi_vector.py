"""Multi-vector (ColBERT-style, late-interaction) embeddings: one vector per token, scored by
MaxSim, as sentence-transformers 6's ``MultiVectorEncoder`` computes them.

A folder saved by ``MultiVectorEncoder.save`` holds ``modules.json`` naming, in order: the
``Transformer`` (its ``sentence_bert_config.json`` may set ``query_length`` and
``document_length``), token-level ``Dense`` projections (``1_Dense/config.json`` and
``model.safetensors``), a ``MultiVectorMask`` (the skip-list: token strings whose rows are
dropped for the tasks it names, documents by default), and a token-level ``Normalize``.
``config_sentence_transformers.json`` holds the prompts (``"query"``, ``"document"``), the
similarity (``"maxsim"`` or ``"meanmaxsim"``) and ``truncate_dim``.

PyLate folders (``pylate.models.Dense.Dense``, ``query_prefix`` ...) and Stanford ColBERT folders
(``HF_ColBERT``, ``artifact.metadata``) load as sentence-transformers loads them
(:mod:`.colbert_folders`): their markers become the prompts, queries are expanded with mask
tokens, punctuation is skipped in documents. A SentenceTransformer folder with a Dense
projection is converted as sentence-transformers converts it (pooling dropped, the projection run
on each token, a MultiVectorMask and a Normalize added). Everything else is refused by name
before the weights are read: token pooling, routers, processing overrides, activations outside a
fixed table of torch's own. A batch runs padding-free through bertattn's encoder (expanded
queries whose mask tokens are not attended to run padded); the real
tokens are gathered once (``(T, E)``), projected, masked and normalized as one tensor, and each
text's rows are returned as views into it (no padded copy).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, check_bool, check_int, check_str, describe
from ..encoder import Bert
from ..encoder.dense import DENSE_TYPES, Projection, read_dense
from ..encoder.folder import HubOptions, ModelFolder, locate_model, read_config_json
from ..encoder.jsonfile import read_json, read_json_object, show
from ..encoder.st_compat import UnsupportedArgumentError, text_list
from ..errors import ModelFolderError
from .base import HeadSurface, task_encode
from .card_keywords import card_keywords
from .colbert_folders import (
    Expansion,
    LegacySettings,
    expanded_batch,
    key_masked_hidden,
    mask_token_id,
    read_expansion,
    read_legacy_config,
    read_stanford_metadata,
    register_prefixes,
)
from .runner import token_batches
from .saving import model_files
from .sparse_folder import refuse_other_sparse

logger = logging.getLogger("bertattn.heads")

__all__ = ["MultiVectorEncoder", "MultiVectorSettings", "maxsim", "read_multi_vector_folder"]

_TRANSFORMER = {
    "sentence_transformers.base.modules.transformer.Transformer",
    "sentence_transformers.base.modules.Transformer",
    "sentence_transformers.models.Transformer",
}
#: a SentenceTransformer folder's pooling, dropped when it is converted (token rows are kept)
_POOLING = {
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    "sentence_transformers.sentence_transformer.modules.Pooling",
    "sentence_transformers.models.Pooling",
}
_MASK = {
    "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
    "sentence_transformers.multi_vector_encoder.modules.MultiVectorMask",
}
_NORMALIZE = {
    "sentence_transformers.base.modules.normalize.Normalize",
    "sentence_transformers.base.modules.Normalize",
    "sentence_transformers.models.Normalize",
}
#: sentence_bert_config.json keys of the Transformer: read, or harmless (a speed knob)
_SBERT_KEYS = {
    "transformer_task",
    "modality_config",
    "module_output_name",
    "query_length",
    "document_length",
    "query_expansion",
    "unpad_inputs",
    "max_seq_length",
    "do_lower_case",
}
SIMILARITIES = ("maxsim", "meanmaxsim")
TASKS = ("query", "document")


@dataclass
class MultiVectorSettings:
    """What a ``MultiVectorEncoder`` folder says. ``steps``: the token-level modules after the
    Transformer, in order (a :class:`Projection`, or ``"normalize"``); ``skiplist_words`` /
    ``skiplist_tasks`` / ``keep_only_token_ids``: the ``MultiVectorMask`` (None when the folder
    has none); ``query_length`` / ``document_length``: tokens kept per task (None: the
    tokenizer's limit); ``expansion``: how queries are expanded with mask tokens (None: they
    are not); ``prefixes``: a PyLate / Stanford ColBERT folder's markers by task (registered on
    the tokenizer as single tokens); ``form``: ``"sentence-transformers"``, ``"pylate"``,
    ``"stanford"`` or ``"converted"`` (a SentenceTransformer folder's projection run on its
    tokens); prompts, default_prompt_name, similarity_fn_name, truncate_dim: from
    ``config_sentence_transformers.json``."""

    steps: list[Projection | str] = field(default_factory=list)
    has_mask: bool = False
    skiplist_words: list[str] = field(default_factory=list)
    skiplist_tasks: list[str] = field(default_factory=lambda: ["document"])
    keep_only_token_ids: list[int] | None = None
    query_length: int | None = None
    document_length: int | None = None
    expansion: Expansion | None = None
    prefixes: dict[str, str] = field(default_factory=dict)
    form: str = "sentence-transformers"
    prompts: dict[str, str | None] = field(
        default_factory=lambda: {"query": None, "document": None}
    )
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    truncate_dim: int | None = None
    files: list[Path] = field(default_factory=list)


def _module_path(root: Path, modules: Path, i: int, entry: dict) -> Path:
    sub = entry.get("path", "")
    if not isinstance(sub, str) or Path(sub).is_absolute() or ".." in Path(sub).parts:
        raise ModelFolderError(
            f"{modules}: entry {i}: path {show(sub)} must be a relative folder inside {root}."
        )
    return root / sub if sub else root


def _read_mask(path: Path, out: MultiVectorSettings) -> None:
    cfg = read_json_object(path) if path.is_file() else {}
    extra = sorted(set(cfg) - {"skiplist_words", "skiplist_tasks", "keep_only_token_ids"})
    if extra:
        raise ModelFolderError(
            f"{path}: bertattn does not know the MultiVectorMask settings {extra}."
        )
    words = cfg.get("skiplist_words") or []
    tasks = cfg.get("skiplist_tasks", ["document"])
    tasks = [tasks] if isinstance(tasks, str) else tasks
    keep = cfg.get("keep_only_token_ids")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ModelFolderError(
            f"{path}: skiplist_words must be a list of strings, got {show(words)}."
        )
    if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
        raise ModelFolderError(
            f"{path}: skiplist_tasks must be a list of strings, got {show(tasks)}."
        )
    if keep is not None and (
        not isinstance(keep, list)
        or not all(isinstance(t, int) and not isinstance(t, bool) for t in keep)
    ):
        raise ModelFolderError(f"{path}: keep_only_token_ids must be null or a list of ints.")
    out.has_mask = True
    out.skiplist_words, out.skiplist_tasks, out.keep_only_token_ids = words, tasks, keep
    out.files.append(path)


def _read_transformer(model_dir: Path, out: MultiVectorSettings) -> tuple[int | None, set[str]]:
    """The Transformer's ``max_seq_length`` and the keys its ``sentence_bert_config.json``
    gives (they override a PyLate folder's top-level ones); the lengths and the query
    expansion set on ``out``."""
    path = model_dir / "sentence_bert_config.json"
    if not path.is_file():
        return None, set()
    cfg = read_json_object(path)
    out.files.append(path)
    extra = sorted(set(cfg) - _SBERT_KEYS)
    if extra:
        raise ModelFolderError(
            f"{path}: {extra} not supported by bertattn's MultiVectorEncoder (it reads "
            f"{sorted(_SBERT_KEYS)}); save the folder without them."
        )
    task = cfg.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ModelFolderError(
            f"{path}: transformer_task {show(task)}: a multi-vector encoder's Transformer is "
            f"'feature-extraction'."
        )
    modality = cfg.get("modality_config", {"text": {}})
    text = modality.get("text") if isinstance(modality, dict) else None
    if not isinstance(modality, dict) or set(modality) != {"text"} or not isinstance(text, dict):
        raise ModelFolderError(
            f"{path}: modality_config {show(modality)}: bertattn reads text only."
        )
    if text.get("method_output_name", "last_hidden_state") != "last_hidden_state":
        raise ModelFolderError(
            f"{path}: modality_config's text output is {show(text.get('method_output_name'))}; "
            f"bertattn gives the last hidden state."
        )
    if cfg.get("module_output_name", "token_embeddings") != "token_embeddings":
        raise ModelFolderError(f"{path}: module_output_name must be 'token_embeddings'.")
    out.expansion = read_expansion(cfg.get("query_expansion"), path)
    if cfg.get("do_lower_case"):
        raise ModelFolderError(
            f"{path}: do_lower_case is not supported; lowercase in the tokenizer."
        )
    for key in ("query_length", "document_length", "max_seq_length"):
        value = cfg.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 3
        ):
            raise ModelFolderError(f"{path}: {key} must be null or an int >= 3, got {show(value)}.")
    out.query_length, out.document_length = cfg.get("query_length"), cfg.get("document_length")
    return cfg.get("max_seq_length"), set(cfg)


#: the model types a MultiVectorEncoder loads: its own, PyLate 3's, and a SentenceTransformer
#: folder's (converted: its projection run on each token)
_MODEL_TYPES = ("MultiVectorEncoder", "ColBERT", "SentenceTransformer")


def _read_st_config(root: Path, out: MultiVectorSettings, native: bool) -> LegacySettings:
    """``config_sentence_transformers.json`` onto ``out``; returns its PyLate fields.
    ``native``: the modules make a MultiVectorEncoder themselves (a MultiVectorMask), so a
    missing ``model_type`` means MultiVectorEncoder (else SentenceTransformer, as
    sentence-transformers reads it)."""
    path = root / "config_sentence_transformers.json"
    if not path.is_file():
        out.form = "sentence-transformers" if native else "converted"
        return LegacySettings()
    cfg = read_json_object(path)
    out.files.append(path)
    kind = cfg.get("model_type", "MultiVectorEncoder" if native else "SentenceTransformer")
    if kind not in _MODEL_TYPES:
        raise ModelFolderError(
            f"{path}: model_type is {show(kind)}; bertattn.MultiVectorEncoder loads "
            f"'MultiVectorEncoder' folders, PyLate's ('ColBERT') and SentenceTransformer ones "
            f"(a SparseEncoder: bertattn.SparseEncoder; a CrossEncoder: bertattn.CrossEncoder)."
        )
    legacy = read_legacy_config(cfg, path)
    if kind != "MultiVectorEncoder":
        out.form = (
            "pylate"
            if (legacy.pylate_v3 or legacy.prefixes or legacy.transformer)
            else ("converted")
        )
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(v, str) or v is None for v in prompts.values()
    ):
        raise ModelFolderError(
            f"{path}: prompts must be an object of strings, got {show(prompts)}."
        )
    out.prompts.update(prompts)
    out.prompts.update(legacy.prompts)
    name = cfg.get("default_prompt_name")
    if name is not None and name not in out.prompts:
        raise ModelFolderError(
            f"{path}: default_prompt_name {show(name)} is not among the prompts."
        )
    out.default_prompt_name = name
    fn = cfg.get("similarity_fn_name")
    if out.form != "sentence-transformers" and fn not in SIMILARITIES:
        fn = None  # a single-vector model's, or PyLate's "MaxSim": MaxSim, as upstream reads it
    if fn is not None and fn not in SIMILARITIES:
        raise ModelFolderError(
            f"{path}: similarity_fn_name {show(fn)}; a multi-vector model scores with one of "
            f"{SIMILARITIES}."
        )
    out.similarity_fn_name = fn
    dim = cfg.get("truncate_dim")
    if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 1):
        raise ModelFolderError(
            f"{path}: truncate_dim must be null or an int >= 1, got {show(dim)}."
        )
    out.truncate_dim = dim
    return legacy


def _module_types(data: object) -> list[object]:
    """The ``type`` of each module of a ``modules.json`` array (empty for anything else)."""
    if not isinstance(data, list):
        return []
    return [m.get("type") for m in data if isinstance(m, dict)]


def _read_normalize(where: Path, converting: bool) -> bool:
    """Whether a Normalize module normalizes the token rows (True) or, in a SentenceTransformer
    folder being converted, the sentence embedding (False: dropped with the pooling)."""
    path = where / "config.json"
    cfg = read_json_object(path) if path.is_file() else {}
    reads = cfg.get("module_input_name", "sentence_embedding" if converting else "token_embeddings")
    if converting and reads == "sentence_embedding":
        return False
    if reads != "token_embeddings":
        raise ModelFolderError(
            f"{path}: Normalize reads {show(reads)}; a multi-vector model normalizes "
            f"'token_embeddings'."
        )
    return True


def _read_modules(root: Path, modules: Path, data: list, out: MultiVectorSettings) -> Path:
    """The modules after the Transformer onto ``out.steps`` (``out.form`` "converted" /
    "pylate": pooling and a sentence-level Normalize dropped, a sentence-level Dense run on each
    token); returns the Transformer's folder."""
    converting = out.form in ("converted", "pylate")
    first = data[0]
    if first.get("type") not in _TRANSFORMER:
        raise ModelFolderError(
            f"{modules}: entry 0 is {show(first.get('type'))}; a MultiVectorEncoder starts with "
            f"sentence-transformers' Transformer."
        )
    for i, entry in enumerate(data[1:], start=1):
        kind = entry.get("type")
        where = _module_path(root, modules, i, entry)
        if kind in DENSE_TYPES:
            out.steps.append(read_dense(where, converting=converting))
            out.files.append(where / "config.json")
        elif kind in _NORMALIZE:
            if _read_normalize(where, converting):
                out.steps.append("normalize")
        elif kind in _MASK:
            if out.has_mask:
                raise ModelFolderError(f"{modules}: entry {i}: a second MultiVectorMask.")
            _read_mask(where / "config.json", out)
        elif not (converting and kind in _POOLING):
            raise ModelFolderError(
                f"{modules}: entry {i}: module type {str(kind)[:160]!r} is not part of a "
                f"multi-vector model bertattn runs (Transformer, then Dense, MultiVectorMask and "
                f"Normalize): token pooling, routers and custom modules are not supported."
            )
    return _module_path(root, modules, 0, first)


def _convert(root: Path, out: MultiVectorSettings, legacy: LegacySettings) -> None:
    """A PyLate or SentenceTransformer folder made a MultiVectorEncoder as sentence-transformers
    makes it: a MultiVectorMask (the folder's skip-list; PyLate's punctuation by default) and a
    token-level Normalize after its projections. A folder with no projection is refused:
    sentence-transformers adds a randomly initialised one, which must be trained first."""
    if not any(isinstance(s, Projection) for s in out.steps):
        raise ModelFolderError(
            f"{root}: a SentenceTransformer folder without a Dense projection; "
            f"sentence-transformers' MultiVectorEncoder adds a randomly initialised (hidden, 128) "
            f"projection to it, which means nothing until trained. Train it with "
            f"sentence-transformers, save it (MultiVectorEncoder.save), and load that folder; "
            f"for sentence embeddings of this folder use bertattn.Bert."
        )
    if not out.has_mask:
        out.has_mask = True
        out.skiplist_words, out.skiplist_tasks = legacy.default_skiplist(), ["document"]
    out.steps.append("normalize")


def _apply_legacy(out: MultiVectorSettings, legacy: LegacySettings, given: set[str]) -> None:
    """A PyLate / Stanford folder's lengths, expansion and markers onto ``out``, where the
    Transformer's own ``sentence_bert_config.json`` (``given``: its keys) does not set them."""
    knobs = legacy.transformer
    if "query_length" in knobs and "query_length" not in given:
        out.query_length = knobs["query_length"]
    if "document_length" in knobs and "document_length" not in given:
        out.document_length = knobs["document_length"]
    if "query_expansion" in knobs and "query_expansion" not in given:
        out.expansion = knobs["query_expansion"]
    out.prefixes = dict(legacy.prefixes)


def _check_widths(root: Path, model_dir: Path, steps: list[Projection | str]) -> None:
    width = read_config_json(model_dir).hidden_size
    for step in steps:
        if isinstance(step, Projection):
            if step.weight.shape[1] != width:
                raise ModelFolderError(
                    f"{root}: a Dense projection takes {step.weight.shape[1]} features but the "
                    f"layer before it gives {width}."
                )
            width = step.weight.shape[0]


def _read_stanford(root: Path) -> MultiVectorSettings:
    """A Stanford ColBERT folder (``HF_ColBERT``): the projection ``linear.weight`` among the
    encoder's tensors, ``artifact.metadata``'s settings, a MultiVectorMask and Normalize."""
    tensors = _root_tensor(root, "linear.weight")
    out = MultiVectorSettings(form="stanford", files=[root / "config.json"])
    if (root / "artifact.metadata").is_file():
        out.files.append(root / "artifact.metadata")
    else:
        logger.warning("%s: no artifact.metadata; using Stanford ColBERT's defaults.", root)
    legacy = read_stanford_metadata(root)
    out.steps = [Projection(tensors.float(), None, "torch.nn.modules.linear.Identity")]
    _convert(root, out, legacy)
    _apply_legacy(out, legacy, set())
    out.prompts.update(legacy.prompts)  # (a config_sentence_transformers.json is not read,
    return out  # as sentence-transformers reads none for such a folder)


def _root_tensor(root: Path, name: str) -> Tensor:
    """One tensor of the folder's own weights (``model.safetensors`` read for that tensor only,
    else ``pytorch_model.bin``)."""
    st, pt = root / "model.safetensors", root / "pytorch_model.bin"
    if st.is_file():
        from safetensors import safe_open

        with safe_open(str(st), framework="pt", device="cpu") as f:
            if name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                return f.get_tensor(name)
    elif pt.is_file():
        found = torch.load(pt, map_location="cpu", weights_only=True).get(name)
        if found is not None:
            return found
    raise ModelFolderError(
        f"{root}: config.json names HF_ColBERT (Stanford ColBERT) but its weights hold no "
        f"{name!r} (the projection); use the folder as Stanford ColBERT saved it."
    )


def read_multi_vector_folder(
    path: str | Path, *, hub: HubOptions | None = None
) -> tuple[ModelFolder, MultiVectorSettings]:
    """The encoder's :class:`ModelFolder` and the :class:`MultiVectorSettings` of ``path``: a
    folder saved by sentence-transformers' ``MultiVectorEncoder``, by PyLate, by Stanford
    ColBERT (``HF_ColBERT``), or a SentenceTransformer folder with a Dense projection
    (converted as sentence-transformers converts it); or a cached hub name, fetched with
    ``hub``. Raises :class:`~bertattn.errors.ModelFolderError` naming the file and what it
    holds that bertattn does not run."""
    root = locate_model(path, hub=hub)
    modules = root / "modules.json"
    if not modules.is_file():
        if "HF_ColBERT" in _architectures(root):
            out = _read_stanford(root)
            _check_widths(root, root, out.steps)
            return _folder(path, root, root, None, out), out
        raise ModelFolderError(
            f"{root}: no modules.json; a MultiVectorEncoder folder is saved by "
            f"sentence-transformers' MultiVectorEncoder (Transformer, Dense, MultiVectorMask, "
            f"Normalize), by PyLate, or by Stanford ColBERT (config.json naming HF_ColBERT). A "
            f"plain Hugging Face folder has no projection to read."
        )
    data = read_json(modules)
    refuse_other_sparse(modules, data, "a MultiVectorEncoder")
    if not isinstance(data, list) or not data or not all(isinstance(m, dict) for m in data):
        raise ModelFolderError(f"{modules}: expected a JSON array of modules.")
    out = MultiVectorSettings(files=[modules])
    native = any(t in _MASK for t in _module_types(data))
    legacy = _read_st_config(root, out, native)
    model_dir = _read_modules(root, modules, data, out)
    max_length, given = _read_transformer(model_dir, out)
    if out.form in ("converted", "pylate"):
        _convert(root, out, legacy)
    _apply_legacy(out, legacy, given)
    _check_widths(root, model_dir, out.steps)
    return _folder(path, root, model_dir, max_length, out), out


def _architectures(root: Path) -> list[str]:
    path = root / "config.json"
    archs = read_json_object(path).get("architectures") if path.is_file() else None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _folder(
    path: str | Path, root: Path, model_dir: Path, max_length: int | None, out: MultiVectorSettings
) -> ModelFolder:
    return ModelFolder(
        str(path),
        root,
        model_dir,
        read_config_json(model_dir),
        pooling="mean",
        max_length=max_length,
        settings_files=tuple(out.files),
    )


# ---------------------------------------------------------------------- scoring
def _as_list(embeddings: object, name: str) -> list[Tensor]:
    """A list of ``(n_i, d)`` float tensors from a list of tensors / arrays, one 2-D tensor or
    array (one item), or a padded 3-D tensor (every row counts)."""
    if isinstance(embeddings, np.ndarray):
        embeddings = torch.from_numpy(embeddings)
    if isinstance(embeddings, Tensor):
        if embeddings.ndim == 2:
            return [embeddings]
        if embeddings.ndim == 3:
            return list(embeddings)
        raise ValueError(
            f"{name} is a {embeddings.ndim}-D tensor of shape {tuple(embeddings.shape)}; pass a "
            f"list of (tokens, dim) tensors, one (tokens, dim) tensor or a (N, tokens, dim) one."
        )
    if isinstance(embeddings, (list, tuple)):
        out = []
        for i, e in enumerate(embeddings):
            t = torch.from_numpy(e) if isinstance(e, np.ndarray) else e
            if not isinstance(t, Tensor) or t.ndim != 2:
                raise ValueError(
                    f"{name}[{i}] must be a (tokens, dim) tensor or array, got "
                    f"{describe(e) if not isinstance(t, Tensor) else tuple(t.shape)}."
                )
            out.append(t)
        return out
    raise ArgumentTypeError(
        f"{name} must be a list of (tokens, dim) tensors or arrays (what encode_query / "
        f"encode_document return), got {describe(embeddings)}."
    )


def _packed(items: list[Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """``(T, d)`` float32 rows of all items and ``(T,)`` each row's item index."""
    counts = torch.tensor([len(t) for t in items], device=device)
    rows = torch.cat([t.to(device, torch.float32) for t in items])
    return rows, torch.repeat_interleave(torch.arange(len(items), device=device), counts)


def maxsim(
    queries: object,
    documents: object,
    *,
    length_normalize: bool = False,
    chunk_elements: int = 50_000_000,
) -> Tensor:
    """``(Q, D)`` float32: ``sum_i max_j q_i . d_j`` for every query and document (MaxSim;
    ``length_normalize``: divided by the query's tokens, mean-MaxSim), on the documents'
    device. The token products are computed on packed rows, ``chunk_elements`` at a time."""
    qs, ds = _as_list(queries, "embeddings1"), _as_list(documents, "embeddings2")
    device = ds[0].device if ds else (qs[0].device if qs else torch.device("cpu"))
    if not qs or not ds:
        return torch.zeros(len(qs), len(ds), dtype=torch.float32, device=device)
    widths = {t.shape[1] for t in qs + ds}
    if len(widths) != 1:
        raise ValueError(f"the embeddings have different widths {sorted(widths)}; use one model's.")
    q, q_of = _packed(qs, device)  # (Tq, d), (Tq,)
    out = torch.zeros(len(qs), len(ds), dtype=torch.float32, device=device)
    per_doc = max(1, chunk_elements // max(1, len(q)))  # document rows per chunk
    start = 0
    while start < len(ds):
        end, rows = start, 0
        while end < len(ds) and (end == start or rows + len(ds[end]) <= per_doc):
            rows += len(ds[end])
            end += 1
        d, d_of = _packed(ds[start:end], device)  # (Td, d), (Td,)
        sim = q @ d.T  # (Tq, Td)
        best = torch.full((len(q), end - start), float("-inf"), device=device)  # (Tq, n)
        best.scatter_reduce_(1, d_of.expand(len(q), -1), sim, "amax")
        scores = torch.zeros(len(qs), end - start, device=device).index_add_(0, q_of, best)
        out[:, start:end] = scores  # (Q, n)
        start = end
    if length_normalize:
        out /= torch.tensor([max(len(t), 1) for t in qs], device=device, dtype=torch.float32)[
            :, None
        ]
    return out


# ---------------------------------------------------------------------- the encoder
class MultiVectorEncoder(HeadSurface):
    """A sentence-transformers ``MultiVectorEncoder`` folder on bertattn's encoder.

    ``model``: the folder (or a cached hub name); ``device``, ``dtype``, ``threads``,
    ``backend``: as :meth:`bertattn.Bert.load`; ``truncate_dim``: default for the encode
    methods (None: the folder's); ``similarity_fn_name``: ``"maxsim"`` (default) or
    ``"meanmaxsim"`` (None: the folder's); ``prompts`` / ``default_prompt_name``: yours over the
    folder's (a PyLate / Stanford folder's markers included), as sentence-transformers merges
    them. The keywords model cards pass (``revision``,
    ``local_files_only``, ``cache_folder``, ``token``, ``torch_dtype``, ``model_kwargs``,
    ``automodel_args``, ``trust_remote_code``) are taken as :mod:`bertattn.heads.card_keywords`
    says.

    Attributes: ``bert`` (the encoder), ``settings`` (:class:`MultiVectorSettings`),
    ``prompts``, ``default_prompt_name``, ``truncate_dim``, ``similarity_fn_name``.
    """

    #: ``encode_document`` takes the folder's ``"document"`` prompt only
    TASK_PROMPTS = {"query": ("query",), "document": ("document",)}

    def __init__(
        self,
        model: str | Path,
        *,
        device: str | int | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        threads: int | None = None,
        backend: str = "auto",
        truncate_dim: int | None = None,
        similarity_fn_name: str | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        **card: Any,
    ) -> None:
        options = card_keywords(self, card, dtype=dtype)
        self.merged_prompts({}, None, prompts, None)  # checked before the folder is read
        if model is None or not isinstance(model, (str, Path)):
            raise ArgumentTypeError(
                f"model must be a MultiVectorEncoder folder (str or Path) or a cached hub name, "
                f"got {describe(model)}."
            )
        truncate_dim = check_int(truncate_dim, "truncate_dim", low=1, optional=True)
        folder, settings = read_multi_vector_folder(model, hub=options.hub)
        self.settings = settings
        st_logger = logging.getLogger("bertattn.encoder")
        quiet = _DropSimilarityNote()
        st_logger.addFilter(quiet)  # "maxsim is not a sentence similarity": not for this model
        try:
            with warnings.catch_warnings():  # Stanford's projection is read by this class
                if settings.form == "stanford":
                    warnings.filterwarnings("ignore", message=r".*skipped 1 task-head tensors")
                self.bert = Bert.load(
                    folder, dtype=options.dtype, device=device, threads=threads, backend=backend
                )
        finally:
            st_logger.removeFilter(quiet)
        self.prompts: dict[str, str | None]
        self.prompts, self.default_prompt_name = self.merged_prompts(
            settings.prompts, settings.default_prompt_name, prompts, default_prompt_name
        )
        self.truncate_dim = settings.truncate_dim if truncate_dim is None else truncate_dim
        self._similarity_fn_name: str | None = None
        self.similarity_fn_name = similarity_fn_name or settings.similarity_fn_name or "maxsim"
        device_ = self.bert.device
        self._steps = [
            s
            if isinstance(s, str)
            else Projection(
                s.weight.to(device_), None if s.bias is None else s.bias.to(device_), s.activation
            )
            for s in settings.steps
        ]
        register_prefixes(self.bert.tokenizer, settings.prefixes)
        self._skip_ids = self._resolve_skiplist(settings.skiplist_words)
        keep = settings.keep_only_token_ids
        self._keep_ids = None if not keep else torch.tensor(keep, device=device_)
        expansion = settings.expansion
        self._fill_id = (
            None
            if expansion is None
            else mask_token_id(self.bert.tokenizer, folder.model_dir, expansion.token)
        )

    def _resolve_skiplist(self, words: list[str]) -> Tensor | None:
        """The skip-list's token ids; a word that is not one vocabulary token is dropped with a
        warning (as sentence-transformers does: it would otherwise skip every unknown token)."""
        ids, unknown = [], []
        for word in words:
            found = self.bert.tokenizer.token_to_id(word)
            (unknown if found is None else ids).append(word if found is None else found)
        if unknown:
            logger.warning(
                "skip-list words %s are not single vocabulary tokens of this tokenizer; they are "
                "dropped from the skip-list.",
                unknown,
            )
        return torch.tensor(ids, device=self.bert.device) if ids else None

    # ------------------------------------------------------------------ settings
    #: the similarity functions :attr:`similarity_fn_name` takes (sentence-transformers' name)
    SUPPORTED_SIMILARITY_FN_NAMES = SIMILARITIES

    @property
    def similarity_fn_name(self) -> str:
        """``"maxsim"`` or ``"meanmaxsim"`` (MaxSim divided by the query's tokens)."""
        return self._similarity_fn_name or "maxsim"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str) -> None:
        value = getattr(value, "value", value)  # sentence-transformers' SimilarityFunction
        check_str(value, "similarity_fn_name")
        if value not in SIMILARITIES:
            raise ValueError(
                f"similarity_fn_name {value!r} is not supported: a multi-vector model scores with "
                f"one of {SIMILARITIES}; cosine / dot / euclidean are for single vectors."
            )
        self._similarity_fn_name = value

    def get_embedding_dimension(self) -> int:
        """The width of a token row (after the projections and ``truncate_dim``)."""
        width = self.bert.model.config.hidden_size
        for step in self._steps:
            if isinstance(step, Projection):
                width = step.weight.shape[0]
        return width if self.truncate_dim is None else min(width, self.truncate_dim)

    def _saved_files(self) -> dict[str, Any]:
        """The prompts, default prompt, similarity, ``truncate_dim`` and max length, as
        sentence-transformers' ``MultiVectorEncoder.save`` writes them."""
        files: dict[str, Any] = model_files(self.bert.folder, self.max_seq_length)
        files["config_sentence_transformers.json"] = {
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "similarity_fn_name": self.similarity_fn_name,
            "truncate_dim": self.truncate_dim,
        }
        return files

    def __repr__(self) -> str:
        s = self.settings
        expansion = "" if s.expansion is None else f", query_expansion={s.expansion.length}"
        form = "" if s.form == "sentence-transformers" else f", form={s.form}"
        return (
            f"MultiVectorEncoder({self.bert.name!r}, dim={self.get_embedding_dimension()}, "
            f"query_length={s.query_length}, document_length={s.document_length}{expansion}, "
            f"skiplist={len(s.skiplist_words)} words, similarity={self.similarity_fn_name}{form})"
        )

    # ------------------------------------------------------------------ encoding
    def encode(
        self,
        inputs: str | Sequence[str],
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        output_value: str | None = "token_embeddings",
        convert_to_numpy: bool = False,
        device: str | torch.device | None = None,
        normalize_embeddings: bool = False,
        token_pooling: object = None,
        truncate_dim: int | None = None,
        pool: object = None,
        chunk_size: int | None = None,
        task: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Per-token embeddings, as sentence-transformers' ``MultiVectorEncoder.encode`` gives
        them: a list with one ``(n_i, d)`` float32 tensor per text (its scored tokens: real
        tokens, the skip-list's left out where it applies), in input order; one tensor for one
        str; NumPy arrays with ``convert_to_numpy``. ``prompt`` / ``prompt_name`` as
        sentence-transformers resolves them (``default_prompt_name`` when neither is given);
        ``normalize_embeddings``: L2 each row; ``truncate_dim``: keep the first dimensions and
        L2-normalize (default: the folder's); ``task``: ``"query"``, ``"document"`` or None
        (no length of its own; skip-list as for documents). ``output_value=None``,
        ``token_pooling``, ``pool`` and a list of devices are refused (not supported here).
        The rows of one batch are views into one packed ``(T, d)`` tensor."""
        self._refuse(output_value, token_pooling, pool, device, kwargs)
        if show_progress_bar is not None:
            check_bool(show_progress_bar, "show_progress_bar")
        check_bool(convert_to_numpy, "convert_to_numpy")
        check_bool(normalize_embeddings, "normalize_embeddings")
        check_int(chunk_size, "chunk_size", low=1, optional=True)
        batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
        if task is not None and task not in TASKS:
            raise ValueError(f"task must be one of {TASKS} or None, got {task!r}.")
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        truncate_dim = check_int(truncate_dim, "truncate_dim", low=1, optional=True)
        if device is not None:
            self.bert.to(device)  # type: ignore[arg-type]
            self._to(self.bert.device)
        texts, single = text_list(inputs, "inputs")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ArgumentTypeError(f"inputs[{i}] must be a str, got {describe(t)}.")
        prompt = self._prompt(prompt, prompt_name)
        if prompt:
            texts = [prompt + t for t in texts]
        limit = self._limit(task)
        out: list[Any] = [None] * len(texts)
        with torch.inference_mode():  # cut at the task's length, as intended
            for idx, encodings in token_batches(self.bert, texts, batch_size, limit):
                rows = self._rows(encodings, task, normalize_embeddings, truncate_dim)
                for i, r in zip(idx, rows, strict=True):
                    out[i] = r.numpy(force=True) if convert_to_numpy else r
        return out[0] if single else out

    encode_query = task_encode(
        "query",
        encode,
        """Token rows of queries: :meth:`encode` with ``task="query"`` and, when neither
        ``prompt`` nor ``prompt_name`` is given, the folder's ``"query"`` prompt (none when it
        has none; never ``default_prompt_name``); texts cut at the folder's ``query_length``.""",
    )
    encode_document = task_encode(
        "document",
        encode,
        """Token rows of documents: :meth:`encode` with ``task="document"`` and, when neither
        ``prompt`` nor ``prompt_name`` is given, the folder's ``"document"`` prompt; cut at the
        folder's ``document_length``; skip-list tokens dropped (for the tasks the folder's
        MultiVectorMask names: documents by default).""",
    )

    def task_length(self, task: str | None) -> int | None:
        """The folder's tokens for a text of ``task`` (None: no length of its own): the
        Transformer's ``query_length`` / ``document_length``; for expanded queries the
        expansion's length (``"fixed"``), or the larger of the two (``"min"``)."""
        s = self.settings
        length = {"query": s.query_length, "document": s.document_length}.get(task or "")
        if task == "query" and s.expansion is not None:
            if s.expansion.strategy == "fixed":
                return s.expansion.length
            return None if length is None else max(length, s.expansion.length)
        return length

    def _limit(self, task: str | None) -> int:
        """Tokens a text of ``task`` is cut at: :meth:`task_length`, else the model's (an
        expanded query's never below its expansion's length); never past its positions."""
        limit = self.task_length(task) or self.bert.max_length
        if task == "query" and self.settings.expansion is not None:
            limit = max(limit, self.settings.expansion.length)
        return min(limit, self.bert.model.config.max_position_embeddings)

    def scored_tokens(self, text: str, task: str) -> tuple[list[str], list[bool]]:
        """The tokens :meth:`encode_query` (``task="query"``) or :meth:`encode_document`
        (``"document"``) encodes ``text`` as (its default prompt, specials, cut at the task's
        length), and for each whether it gets a row (False: the skip-list drops it); the rows
        those methods return are those of the ``True`` tokens, in order."""
        check_str(text, "text")
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
        prompt = self._prompt(None, task if task in self.prompts else None) or ""
        with warnings.catch_warnings():  # cut at the task's length, as encode does
            warnings.filterwarnings("ignore", message=r".* were truncated")
            enc = self.bert.tokenizer.encode_batch([prompt + text], max_length=self._limit(task))[0]
        ids, tokens = list(enc.ids), list(enc.tokens)
        expansion = self.settings.expansion
        if task == "query" and expansion is not None and self._fill_id is not None:
            added = max(expansion.length - len(ids), 0)  # the mask tokens queries get
            ids += [self._fill_id] * added
            tokens += [self.bert.tokenizer.id_to_token(self._fill_id)] * added
        keep = self._scored(torch.tensor(ids, device=self.bert.device), task)
        kept = [True] * len(ids) if keep is None else [bool(k) for k in keep.tolist()]
        return tokens, kept

    def _to(self, device: torch.device) -> None:
        self._steps = [
            s
            if isinstance(s, str)
            else Projection(
                s.weight.to(device), None if s.bias is None else s.bias.to(device), s.activation
            )
            for s in self._steps
        ]
        if self._skip_ids is not None:
            self._skip_ids = self._skip_ids.to(device)
        if self._keep_ids is not None:
            self._keep_ids = self._keep_ids.to(device)

    def _rows(
        self, encodings: Sequence[Any], task: str | None, normalize: bool, truncate_dim: int | None
    ) -> tuple[Tensor, ...]:
        """One batch -> each text's scored token rows, views into one packed tensor."""
        if task == "query" and self.settings.expansion is not None:
            ids, real, hidden = self._expanded(encodings, self.settings.expansion)
        else:
            batch, mask, hidden = self.bert.forward_encodings(encodings)  # hidden (B, L, E)
            real = mask.bool()  # (B, L)
            ids = batch.input_ids.to(real.device)  # (B, L)
        x = hidden[real].float()  # (T, E): the real tokens, packed
        for step in self._steps:
            x = torch.nn.functional.normalize(x, p=2, dim=-1) if step == "normalize" else step(x)  # type: ignore[operator]
        keep = self._scored(ids[real], task)  # (T,)
        counts = real.sum(1)  # (B,)
        if keep is not None:
            owner = torch.repeat_interleave(torch.arange(len(counts), device=x.device), counts)
            x = x[keep]
            counts = torch.bincount(owner[keep], minlength=len(counts))
        if normalize:
            x = torch.nn.functional.normalize(x, p=2, dim=-1)
        if truncate_dim is not None:
            x = torch.nn.functional.normalize(x[:, :truncate_dim], p=2, dim=-1)
        return torch.split(x, counts.tolist())

    def _expanded(self, encodings: Sequence[Any], expansion: Expansion) -> tuple[Tensor, ...]:
        """A query batch expanded with mask tokens, through the encoder: ``(ids, scored,
        hidden)``, ``(B, L)``, ``(B, L)`` bool (real and added tokens) and ``(B, L, E)``.
        Added tokens the encoder does not attend to (``attend`` false) are computed all the
        same, on the padded path (:func:`.colbert_folders.key_masked_hidden`)."""
        device = self.bert.device
        batch = self.bert.tokenizer.pad(encodings)
        ids, keys, types, scored = (
            t.to(device)
            for t in expanded_batch(batch, expansion, self._fill_id)  # type: ignore[arg-type]
        )
        if expansion.attend:
            hidden = self.bert.model(ids, keys.long(), types).last_hidden_state
        else:
            hidden = key_masked_hidden(self.bert.model, ids, keys.long(), types)
        return ids, scored, hidden

    def _scored(self, ids: Tensor, task: str | None) -> Tensor | None:
        """``(T,)`` bool: the tokens the MultiVectorMask keeps (None: all)."""
        keep = None
        if self._skip_ids is not None and (task or "document") in self.settings.skiplist_tasks:
            keep = ~torch.isin(ids, self._skip_ids)
        if task != "query" and self._keep_ids is not None:
            allowed = torch.isin(ids, self._keep_ids)
            keep = allowed if keep is None else keep & allowed
        return keep

    def _prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        check_str(prompt, "prompt", optional=True)
        check_str(prompt_name, "prompt_name", optional=True)
        return self.choose_prompt(
            prompt,
            prompt_name,
            "Prompt name {name!r} not found in the configured prompts dictionary with keys "
            "{names!r}.",
        )

    def _refuse(
        self,
        output_value: object,
        token_pooling: object,
        pool: object,
        device: object,
        kwargs: dict,
    ) -> None:
        if output_value != "token_embeddings":
            raise UnsupportedArgumentError(
                f"output_value={output_value!r} is not supported: bertattn's MultiVectorEncoder "
                f"returns the token rows (output_value='token_embeddings'), not the raw feature "
                f"dicts."
            )
        if token_pooling is not None:
            raise UnsupportedArgumentError(
                "token_pooling= is not supported: bertattn returns every scored token's row."
            )
        if pool is not None or isinstance(device, (list, tuple)):
            raise UnsupportedArgumentError(
                "pool= and a list of devices (multi-process encoding) are not supported: "
                "bertattn encodes in this process, on one device."
            )
        if "convert_to_tensor" in kwargs:
            raise UnsupportedArgumentError(
                "MultiVectorEncoder.encode() has no `convert_to_tensor`: multi-vector embeddings "
                "are variable-length, so there is nothing to stack; it returns a list of tensors "
                "(convert_to_numpy=True: a list of arrays)."
            )
        if kwargs:
            raise UnsupportedArgumentError(
                f"MultiVectorEncoder.encode() got keyword argument(s) it does not take: "
                f"{', '.join(sorted(kwargs))}."
            )

    # ------------------------------------------------------------------ scoring
    def similarity(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N, M)`` float32 MaxSim (or mean-MaxSim, by :attr:`similarity_fn_name`) of every
        query in ``embeddings1`` against every document in ``embeddings2`` (lists of
        ``(tokens, dim)`` rows as the encode methods return, one such tensor, or a padded
        ``(N, tokens, dim)`` tensor whose rows all count)."""
        return maxsim(
            embeddings1, embeddings2, length_normalize=self.similarity_fn_name == "meanmaxsim"
        )

    def similarity_pairwise(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N,)`` float32: the score of ``embeddings1[i]`` with ``embeddings2[i]``."""
        qs, ds = _as_list(embeddings1, "embeddings1"), _as_list(embeddings2, "embeddings2")
        if len(qs) != len(ds):
            raise ValueError(
                f"{len(qs)} queries but {len(ds)} documents; give one of each per pair."
            )
        norm = self.similarity_fn_name == "meanmaxsim"
        device = ds[0].device if ds else torch.device("cpu")
        return torch.tensor(
            [
                float(maxsim([q], [d], length_normalize=norm)[0, 0])
                for q, d in zip(qs, ds, strict=True)
            ],
            dtype=torch.float32,
            device=device,
        )


class _DropSimilarityNote(logging.Filter):
    """Drops the sentence-embedding loader's note that ``maxsim`` is not one of its similarity
    functions (it is this model's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "similarity_fn_name" not in record.getMessage()
