"""The heads a BERT checkpoint carries, on bertattn's encoder: each a thin layer over the
encoder's output, loaded strictly from the checkpoint's own ``config.json`` and tensors.

- :class:`CrossEncoder`: sequence classification (rerankers, classifiers) with
  sentence-transformers' ``predict`` / ``rank``.
- :class:`SparseEncoder`: SPLADE sparse embeddings from a masked-LM head, with
  sentence-transformers' ``encode`` / ``decode`` / ``similarity`` / ``sparsity``.
- :func:`pipeline`: transformers' text-classification, token-classification and fill-mask
  pipelines, answering with the same dictionaries.
"""

from .config import HeadConfig, read_head_config
from .cross_encoder import CrossEncoder
from .pipelines import pipeline
from .sparse import SparseEncoder

__all__ = ["CrossEncoder", "HeadConfig", "SparseEncoder", "pipeline", "read_head_config"]
