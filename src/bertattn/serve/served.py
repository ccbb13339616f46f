"""What one server serves: a model of one kind, the routes it answers and its engine step.

Each kind is a record of :mod:`bertattn.heads.registry`, which names its routes:

==============  ================  ==========================================================
kind (/info)    record            routes
==============  ================  ==========================================================
embedding       embedding         /v1/embeddings, /embeddings, /embed, /embed_all,
                                  /embed_late_chunks
multi_vector    multi-vector      /embed_multi_vector, /embed_all, /rerank, /v1/rerank
m3              bge-m3            /embed_m3, /embed_all
reranker        cross-encoder     /rerank, /v1/rerank, /predict
classifier      classifier        /predict
sparse          sparse            /embed_sparse
==============  ================  ==========================================================

``/tokenize``, ``/decode`` and the probes answer for every kind. A data route the model cannot
answer gets 400 naming the model's head and the routes it answers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..engine import ModelStep
from ..heads.registry import HeadKind, served_kind
from .errors import ApiError

__all__ = ["Served", "model_names", "serve_model"]


@dataclass
class Served:
    """``record`` (the model's :class:`~bertattn.heads.registry.HeadKind`: its routes, its
    name in ``/info``), ``model`` (a :class:`bertattn.Bert`, :class:`bertattn.CrossEncoder`,
    :class:`bertattn.SparseEncoder`, ...), ``bert`` (its encoder: tokenizer, limits, device),
    ``step`` (what the batcher runs)."""

    record: HeadKind
    model: Any
    bert: Any
    step: ModelStep

    @property
    def kind(self) -> str:
        """The kind as ``/info`` names it (``model_type``: ``"reranker"``, ``"sparse"``)."""
        return self.record.served or self.record.name

    @property
    def routes(self) -> tuple[str, ...]:
        """The data routes this model answers (besides ``/tokenize`` and ``/decode``)."""
        return self.record.routes

    def describe(self) -> str:
        """The model's head in words, for messages and ``/info``."""
        return self.record.describe(self.model)

    def require(self, route: str) -> None:
        """400 unless this model answers ``route``."""
        if route not in self.routes:
            raise ApiError(
                400,
                f"this server's model is {self.describe()}: it answers "
                f"{', '.join('POST ' + r for r in self.routes)}, not POST {route}.",
                code="wrong_route_for_model",
            )


def serve_model(model: Any) -> Served:
    """A loaded model as what the server serves: its kind's record (the first that
    ``answers`` for it) says its encoder and whether the server's token step runs it (rows
    per input) or the model's own ``step()``."""
    if isinstance(model, Served):
        return model
    kind = served_kind(model)
    bert = model.bert if kind.wraps else model
    if kind.token_rows:
        from .token_steps import token_step  # its rows: one array (or dict) per input

        return Served(kind, model, bert, token_step(model))
    return Served(kind, model, bert, model.step())


def model_names(name: str) -> tuple[str, ...]:
    """The names a model given as ``name`` is served under (the ``model`` field of requests
    and responses): a local folder's name and its path, or a hub name and its name without
    the org."""
    if os.path.isdir(name):
        names = (os.path.basename(os.path.normpath(name)), name)
    else:
        names = (name, name.rsplit("/", 1)[-1])
    return tuple(n for n in dict.fromkeys(names) if n)
