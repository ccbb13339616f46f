"""bertattn: BERT's multi-head self-attention, correct, fast and visible.

Public API only; see README.md and docs/python-api.md for usage. Names are imported on first
use, so that ``bertattn --help`` and the command line's error handling do not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "AttentionMaps": ".maps",
    "BACKENDS": ".attention",
    "Bert": ".encoder",
    "BertConfig": ".encoder",
    "BertModel": ".encoder",
    "CrossEncoder": ".heads",
    "Dispatch": ".attention",
    "DispatchLog": ".attention",
    "DtypeChoice": ".encoder",
    "Embeddings": ".corpus",
    "M3Encoder": ".heads.m3",
    "MultiHeadAttention": ".attention",
    "MultiVectorEncoder": ".heads.multi_vector",
    "SparseEncoder": ".heads",
    "choose_dtype": ".encoder",
    "explain": ".attention",
    "open_embeddings": ".corpus",
    "pipeline": ".heads",
    "prepare_mask": ".attention",
    "register_backend": ".attention",
}

__all__ = [
    "AttentionMaps",
    "BACKENDS",
    "Bert",
    "BertConfig",
    "BertModel",
    "CrossEncoder",
    "Dispatch",
    "DispatchLog",
    "DtypeChoice",
    "Embeddings",
    "M3Encoder",
    "MultiHeadAttention",
    "MultiVectorEncoder",
    "SparseEncoder",
    "__version__",
    "choose_dtype",
    "explain",
    "open_embeddings",
    "pipeline",
    "prepare_mask",
    "register_backend",
]

if TYPE_CHECKING:
    from .attention import (
        BACKENDS,
        Dispatch,
        DispatchLog,
        MultiHeadAttention,
        explain,
        prepare_mask,
        register_backend,
    )
    from .corpus import Embeddings, open_embeddings
    from .encoder import Bert, BertConfig, BertModel, DtypeChoice, choose_dtype
    from .heads import CrossEncoder, SparseEncoder, pipeline
    from .heads.m3 import M3Encoder
    from .heads.multi_vector import MultiVectorEncoder
    from .maps import AttentionMaps


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bertattn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
