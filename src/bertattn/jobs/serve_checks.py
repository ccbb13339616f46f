"""``bertattn serve``'s checks that need the model folder but not the model: run before the port
is bound and the weights are read, so that a path that is not a model folder or token limits
that cannot work are one line (exit 2) at once, not after the model has loaded.

Reads ``config.json``, the sentence-transformers files and ``tokenizer_config.json``; never the
weights nor the vocabulary."""

from __future__ import annotations

from pathlib import Path

from ..encoder.folder import ModelFolder
from ..encoder.jsonfile import ModelPathNotFoundError
from ..encoder.tokenizer import read_tokenizer_config
from ..errors import UsageError
from ..serve_defaults import check_model_length
from .serve_options import SERVE_FLAGS, ServeOptions

__all__ = ["check_before_load", "check_model_path", "expected_max_length"]

#: ``BertTokenizer.from_folder``'s defaults: no ``model_max_length`` -> 512; HF's "no limit"
#: (1e30) -> 10**6
_TOKENIZER_DEFAULT = 512
_TOKENIZER_CAP = 10**6


def check_model_path(model: str | None) -> None:
    """A local ``--model`` path that exists but is not a model folder (a file; a folder with
    neither ``config.json`` nor ``modules.json``, such as ``/etc``) raises
    :class:`~bertattn.encoder.folder.ModelPathNotFoundError` (a usage error: exit 2), with the
    message the loaders give. Anything else is left to the loader."""
    if model is None:
        return
    path = Path(model).expanduser()
    if path.is_file():
        hint = f" (here: {path.parent})" if path.name == "config.json" else ""
        raise ModelPathNotFoundError(
            f"{path} is a file; pass the model folder (the one with config.json){hint} instead."
        )
    if path.is_dir() and not any((path / f).is_file() for f in ("config.json", "modules.json")):
        raise ModelPathNotFoundError(
            f"{path}: no config.json; pass a Hugging Face BERT folder (config.json, "
            f"model.safetensors, tokenizer) or a sentence-transformers folder (modules.json)."
        )


def expected_max_length(folder: ModelFolder) -> int:
    """The ``max_length`` :meth:`bertattn.Bert.load` will give the folder's model, from its
    files alone: the sentence-transformers ``max_seq_length``, else the tokenizer's
    ``model_max_length`` (512 when absent), at most ``max_position_embeddings``."""
    cfg_path = folder.model_dir / "tokenizer_config.json"
    cfg = read_tokenizer_config(cfg_path) if cfg_path.is_file() else {}
    tokenizer = int(min(cfg.get("model_max_length") or _TOKENIZER_DEFAULT, _TOKENIZER_CAP))
    return min(folder.max_length or tokenizer, folder.config.max_position_embeddings)


def check_before_load(options: ServeOptions) -> ModelFolder:
    """The model folder, read and checked, and the token limits checked against it: a
    ``--max-input-tokens`` above the model's length, or a ``--max-batch-tokens`` below the
    longest input (``--max-input-tokens``, default the model's length), raises
    :class:`~bertattn.errors.UsageError` naming the option, the numbers and the fix."""
    check_model_path(options.model)
    from ..heads.auto import resolve_auto  # a reranker, classifier or SPLADE folder too

    try:
        folder, _ = resolve_auto(options.model, sparse=options.sparse)
    except ValueError as exc:
        if options.sparse and "drop --sparse" in str(exc):
            raise UsageError(str(exc)) from None
        raise
    try:
        check_model_length(
            options.max_input_tokens, options.max_batch_tokens, expected_max_length(folder),
            SERVE_FLAGS,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return folder
