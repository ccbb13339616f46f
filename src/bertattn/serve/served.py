"""What one server serves: a model of one kind, the routes it answers and its engine step.

=============  ==========================================  ===================================
kind           checkpoint                                  routes
=============  ==========================================  ===================================
embedding      a BERT encoder / sentence-transformers      /v1/embeddings, /embeddings, /embed,
                                                           /embed_all, /embed_late_chunks
multi_vector   a sentence-transformers MultiVectorEncoder  /embed_multi_vector, /embed_all,
                                                           /rerank, /v1/rerank (MaxSim)
m3             bge-m3 (colbert_linear.pt, sparse_linear)   /embed_m3, /embed_all
reranker       BertForSequenceClassification, one label    /rerank, /v1/rerank, /predict
classifier     BertForSequenceClassification, labels       /predict
sparse         BertForMaskedLM (SPLADE)                    /embed_sparse
=============  ==========================================  ===================================

``/tokenize``, ``/decode`` and the probes answer for every kind. A data route the model cannot
answer gets 400 naming the model's head and the routes it answers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..engine import ModelStep
from .errors import ApiError

__all__ = ["ROUTES", "Served", "model_names", "serve_model"]

#: the data routes each kind answers (besides /tokenize and /v1/models)
ROUTES = {
    "embedding": ("/v1/embeddings", "/embeddings", "/embed", "/embed_all", "/embed_late_chunks"),
    "multi_vector": ("/embed_multi_vector", "/embed_all", "/rerank", "/v1/rerank"),
    "m3": ("/embed_m3", "/embed_all"),
    "reranker": ("/rerank", "/v1/rerank", "/predict"),
    "classifier": ("/predict",),
    "sparse": ("/embed_sparse",),
}


@dataclass
class Served:
    """``kind`` (see the module docstring), ``model`` (a :class:`bertattn.Bert`,
    :class:`bertattn.CrossEncoder` or :class:`bertattn.SparseEncoder`), ``bert`` (its encoder:
    tokenizer, limits, device), ``step`` (what the batcher runs)."""

    kind: str
    model: Any
    bert: Any
    step: ModelStep

    def describe(self) -> str:
        """The model's head in words, for messages and ``/info``."""
        if self.kind == "embedding":
            return "a sentence-embedding model"
        if self.kind == "sparse":
            return "a SPLADE model (BertForMaskedLM)"
        if self.kind == "multi_vector":
            return "a multi-vector (ColBERT-style) model"
        if self.kind == "m3":
            return "a bge-m3 model (dense, sparse and ColBERT outputs)"
        n = self.model.num_labels
        what = "a reranker" if self.kind == "reranker" else "a classifier"
        arch = self.model.head.architecture or "BertForSequenceClassification"
        return f"{what} ({arch}, {n} label{'s' if n != 1 else ''})"

    def require(self, route: str) -> None:
        """400 unless this model answers ``route``."""
        if route not in ROUTES[self.kind]:
            raise ApiError(
                400,
                f"this server's model is {self.describe()}: it answers "
                f"{', '.join('POST ' + r for r in ROUTES[self.kind])}, not POST {route}.",
                code="wrong_route_for_model",
            )


def serve_model(model: Any) -> Served:
    """A loaded model as what the server serves, by its class."""
    from ..heads import CrossEncoder, SparseEncoder
    from ..heads.m3 import M3Encoder
    from ..heads.multi_vector import MultiVectorEncoder

    if isinstance(model, Served):
        return model
    if isinstance(model, (MultiVectorEncoder, M3Encoder)):
        from .token_steps import token_step  # its rows: one array (or dict) per input

        kind = "multi_vector" if isinstance(model, MultiVectorEncoder) else "m3"
        return Served(kind, model, model.bert, token_step(model))
    if isinstance(model, CrossEncoder):
        kind = "reranker" if model.num_labels == 1 else "classifier"
        return Served(kind, model, model.bert, model.step())
    if isinstance(model, SparseEncoder):
        return Served("sparse", model, model.bert, model.step())
    from .token_steps import token_step  # sentence rows, and token vectors for /embed_all

    return Served("embedding", model, model, token_step(model))


def model_names(name: str) -> tuple[str, ...]:
    """The names a model given as ``name`` is served under (the ``model`` field of requests
    and responses): a local folder's name and its path, or a hub name and its name without
    the org."""
    if os.path.isdir(name):
        names = (os.path.basename(os.path.normpath(name)), name)
    else:
        names = (name, name.rsplit("/", 1)[-1])
    return tuple(n for n in dict.fromkeys(names) if n)
