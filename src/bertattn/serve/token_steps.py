"""Model steps whose rows are token vectors: one array (or dict) per input, of its own length.

The batcher runs one step per model (:mod:`bertattn.engine`); a step here answers the items of
the token-vector routes beside the model's own: an item is a plain encoding (the model's
sentence rows, as :func:`bertattn.engine.embedding_step`), or a :class:`Job` saying what to
compute of its encoding:

- ``Job(enc, "hidden")``: the last hidden states of every token, ``(n, E)`` (``/embed_all``,
  the windows of ``/embed_late_chunks``);
- ``Job(enc, "query" | "document")``: a :class:`bertattn.MultiVectorEncoder`'s scored token
  rows for that task (projected, skip-list applied, normalized), ``(n', d)``;
- ``Job(enc, "m3", flags)``: a :class:`bertattn.M3Encoder`'s outputs as a dict (``dense``,
  ``lexical``, ``colbert``: those in ``flags``).

One batch runs the encoder once per kind of job it holds (a batch of one kind, the common
case, once). Rows come back as NumPy arrays on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import ModelStep, embedding_step

__all__ = ["Job", "TokenStep", "token_step"]


@dataclass(frozen=True)
class Job:
    """One input of a token-vector route: its ``encoding`` (``ids`` / ``type_ids`` as the
    tokenizer's ``pad`` reads them), ``what`` to compute (see the module docstring) and, for
    bge-m3, the outputs asked (``flags``: a subset of ``("dense", "lexical", "colbert")``)."""

    encoding: Any
    what: str
    flags: tuple[str, ...] = ()

    @property
    def ids(self) -> Any:  # the batcher and the tokenizer's pad read the encoding's
        return self.encoding.ids


class TokenStep(ModelStep):
    """A step of ``model`` (a :class:`bertattn.Bert`, :class:`bertattn.MultiVectorEncoder` or
    :class:`bertattn.M3Encoder`) answering plain encodings (the model's sentence rows, Bert
    only) and :class:`Job` items. Its call returns a ``(B, E)`` array when every item is plain
    (the embedding routes' rows, as before), else a list with one row object per item."""

    def __init__(self, model: Any) -> None:
        bert = getattr(model, "bert", model)
        super().__init__(bert, self._compute, "tokens")
        self.model = model
        self._sentences = embedding_step(bert) if model is bert else None

    def __call__(self, encodings: Sequence[Any], tokens: int) -> Any:
        with self.timed(tokens):
            return self._compute(encodings)

    def _compute(self, encodings: Sequence[Any]) -> Any:
        if not any(isinstance(e, Job) for e in encodings):
            if self._sentences is None:
                raise TypeError("this model's step takes token-vector jobs only")
            return self._sentences.compute(encodings).float().cpu().numpy()  # (B, E)
        out: list[Any] = [None] * len(encodings)
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(encodings):
            groups.setdefault(e.what if isinstance(e, Job) else "sentence", []).append(i)
        for what, idx in groups.items():
            rows = self._group(what, [encodings[i] for i in idx])
            for i, r in zip(idx, rows, strict=True):
                out[i] = r
        return out

    def _group(self, what: str, items: list[Any]) -> list[Any]:
        """The rows of items of one kind, in order."""
        bert = self.bert
        if what == "sentence":
            assert self._sentences is not None
            return list(self._sentences.compute(items).float().cpu().numpy())
        encs = [j.encoding for j in items]
        if what == "hidden":
            _, mask, hidden = bert.forward_encodings(encs)  # (B, L, E)
            hidden = hidden.float().cpu()
            return [hidden[j, : len(e.ids)].numpy() for j, e in enumerate(encs)]
        if what in ("query", "document"):
            model = self.model
            rows = model._rows(encs, what, False, model.truncate_dim)
            return [r.float().cpu().numpy() for r in rows]
        if what == "m3":
            flags = set().union(*(j.flags for j in items))
            got = self.model._batch(
                encs,
                return_dense="dense" in flags,
                return_sparse="lexical" in flags,
                return_colbert_vecs="colbert" in flags,
            )
            return [{k: got[k][j] for k in got} for j in range(len(encs))]
        raise ValueError(f"unknown token job {what!r}")


def token_step(model: Any) -> TokenStep:
    """The server's step for ``model`` (see :class:`TokenStep`); the worker runs it under
    inference mode and the thread governor, as every step (:meth:`ModelStep.session`)."""
    return TokenStep(model)
