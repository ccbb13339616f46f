"""A BERT encoder on bertattn's attention: config, model, checkpoints, tokenizer, pipeline."""

from .auto_dtype import DtypeChoice, choose_dtype
from .config import BertConfig
from .folder import ModelFolder, resolve_model
from .graphs import GraphedBert
from .model import BertModel, BertModelOutput
from .pipeline import Bert, quantize_embeddings, resolve_device
from .tokenizer import BertTokenizer

__all__ = [
    "Bert",
    "BertConfig",
    "BertModel",
    "BertModelOutput",
    "BertTokenizer",
    "DtypeChoice",
    "GraphedBert",
    "ModelFolder",
    "choose_dtype",
    "quantize_embeddings",
    "resolve_device",
    "resolve_model",
]
