"""The attention layer: module, backends, masks, dispatch. Knows nothing of BERT."""

from .backends import BACKENDS, BackendSpec, get_backend, register_backend
from .dispatch import Dispatch, DispatchLog, explain
from .masks import PreparedMask, prepare_mask
from .module import MultiHeadAttention
from .steps import StepRecord, record_steps

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "Dispatch",
    "DispatchLog",
    "MultiHeadAttention",
    "PreparedMask",
    "StepRecord",
    "explain",
    "get_backend",
    "prepare_mask",
    "record_steps",
    "register_backend",
]
