"""bertattn: BERT's multi-head self-attention, correct, fast and visible.

Public API only; see the README for usage.
"""

from .attention import (
    BACKENDS,
    Dispatch,
    DispatchLog,
    MultiHeadAttention,
    explain,
    prepare_mask,
    register_backend,
)
from .bert import Bert, BertConfig, BertModel
from .maps import AttentionMaps

__version__ = "0.1.0"

__all__ = [
    "AttentionMaps",
    "BACKENDS",
    "Bert",
    "BertConfig",
    "BertModel",
    "Dispatch",
    "DispatchLog",
    "MultiHeadAttention",
    "__version__",
    "explain",
    "prepare_mask",
    "register_backend",
]
