"""Token classification (taggers, NER): ``bertattn.pipeline("token-classification", model)``
answers as transformers' pipeline does, with each entity's ``start`` / ``end`` character
offsets in the input text.

``aggregation_strategy``:
- ``"none"``: one entry per token (``entity``, ``score``, ``index``, ``word``, ``start``,
  ``end``), special tokens and the ignored labels (default ``["O"]``) left out;
- ``"simple"``: adjacent tokens of one entity type (``B-X`` starts a new one, ``I-X`` or ``X``
  continues it) grouped into ``entity_group`` entries, their score the mean;
- ``"first"`` / ``"average"`` / ``"max"``: first the pieces of each word agree on one label
  (the first piece's, the mean of the pieces' scores, or the most confident piece's), then the
  words are grouped as ``"simple"`` groups tokens.

A piece continues a word when its text in the vocabulary (``##ing``) is longer than the span
of input it covers (``ing``) for a WordPiece vocabulary, and when no space is next to its start
for the others (BPE, SentencePiece): transformers' rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..arguments import check_int, describe
from ..choices import AGGREGATIONS as STRATEGIES
from ..encoder import ModelFolder, resolve_model
from .layers import load_classifier
from .loading import load_encoder
from .pipeline_base import Pipeline
from .registry import TAGGER
from .runner import run_head

__all__ = ["TokenClassificationPipeline"]


class TokenClassificationPipeline(Pipeline):
    """transformers' token-classification pipeline on a ``BertForTokenClassification``
    checkpoint (see the module docstring). ``load``: :meth:`bertattn.Bert.load`'s keywords."""

    task = "token-classification"
    OPTIONS = ("aggregation_strategy", "ignore_labels", "batch_size", "stride")

    def __init__(self, model: str | Path | ModelFolder | None, **load: Any) -> None:
        folder = resolve_model(model)
        who = "the token-classification pipeline"
        self.bert, self.head = load_encoder(folder, TAGGER, who, **load)
        width = self.bert.model.config.hidden_size
        self.classifier = load_classifier(
            folder.weight_file(), width, self.head.num_labels, "token-classification"
        ).to(self.bert.device)
        self.id2label = dict(self.head.id2label)

    def logits(self, texts: Sequence[str], *, batch_size: int = 32) -> list[torch.Tensor]:
        """Each text's ``(L, num_labels)`` float32 token logits ([CLS] and [SEP] included)."""
        return self._run(texts, batch_size)[1]

    def _run(self, texts: Sequence[str], batch_size: int) -> tuple[list[Any], list[torch.Tensor]]:
        encodings = self.bert.tokenizer.encode_batch(texts, max_length=self.bert.max_length)
        classifier = self.classifier
        rows = run_head(
            self.bert, encodings, lambda h, m: classifier(h.float()), batch_size=batch_size
        )
        return encodings, [r[: len(e.ids)] for r, e in zip(rows, encodings, strict=True)]

    def _call(
        self,
        inputs: str | Sequence[str],
        *,
        aggregation_strategy: str = "none",
        ignore_labels: Sequence[str] | None = None,
        batch_size: int = 32,
        stride: int | None = None,
    ) -> Any:
        """Entities of each text (a list for one text). ``stride``: a text longer than the
        model's window is tagged whole, in windows of ``max_length`` tokens that share
        ``stride`` tokens, as transformers' ``stride`` does: each window's entities, then of
        overlapping ones the longer (the more confident on a tie); needs an aggregation."""
        if not isinstance(aggregation_strategy, str) or aggregation_strategy.lower() not in (
            STRATEGIES
        ):
            raise ValueError(
                f"aggregation_strategy must be one of {', '.join(STRATEGIES)}, got "
                f"{describe(aggregation_strategy)}."
            )
        strategy = aggregation_strategy.lower()
        ignore = ["O"] if ignore_labels is None else list(ignore_labels)
        if stride is not None:
            top = self.bert.max_length
            stride = check_int(stride, "stride", low=0, high=top - 3)  # type: ignore[assignment]
            if strategy == "none":
                raise ValueError(
                    "stride tags a long text whole, in windows whose entities are then merged: "
                    "give an aggregation_strategy other than 'none'."
                )
        single = isinstance(inputs, str)
        texts = [inputs] if single else list(inputs)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"inputs[{i}] must be a string, got {describe(t)}.")
        if stride is None:
            encodings, rows = self._run(texts, batch_size)
            windows = [[(enc, row)] for enc, row in zip(encodings, rows, strict=True)]
        else:
            windows = self._windows(texts, stride, batch_size)
        out = []
        for text, parts in zip(texts, windows, strict=True):
            found = []
            for enc, row in parts:
                probs = torch.softmax(row.float(), dim=-1).numpy()  # (L, C)
                found += self._entities(text, enc, probs, strategy, ignore)
            out.append(_overlaps_merged(found) if len(parts) > 1 else found)
        return out[0] if single else out

    def _windows(
        self, texts: list[str], stride: int, batch_size: int
    ) -> list[list[tuple[Any, torch.Tensor]]]:
        """Each text's windows (``stride`` tokens shared) and their logits."""
        tok, top = self.bert.tokenizer, self.bert.max_length
        parts = [tok.encode_windows(t, max_length=top, stride=stride) for t in texts]
        flat = [e for p in parts for e in p]
        classifier = self.classifier
        rows = run_head(self.bert, flat, lambda h, m: classifier(h.float()), batch_size=batch_size)
        out, at = [], 0
        for p in parts:
            out.append([(e, rows[at + j][: len(e.ids)]) for j, e in enumerate(p)])
            at += len(p)
        return out

    def _entities(
        self, text: str, enc: Any, probs: np.ndarray, strategy: str, ignore: list[str]
    ) -> list[dict]:
        """One window's entities by ``strategy``, the ignored labels left out."""
        tokens = self._tokens(text, enc, probs)
        if strategy in ("none", "simple"):
            found = [self._label(t) for t in tokens]
        else:
            found = [self._word(w, strategy) for w in _words(tokens)]
        if strategy != "none":
            found = [self._group(g) for g in _groups(found)]
        key = "entity" if strategy == "none" else "entity_group"
        return [e for e in found if e[key] not in ignore]

    # ------------------------------------------------------------------ the steps
    def _tokens(self, text: str, enc: Any, probs: np.ndarray) -> list[dict]:
        """The input's tokens but [CLS] / [SEP]: piece, scores, span, whether it continues a
        word."""
        tok = self.bert.tokenizer
        unk = tok.unk_token_id
        out = []
        marked = tok.marks_continuations
        for i, (tid, special) in enumerate(zip(enc.ids, enc.special_tokens_mask, strict=True)):
            if special:
                continue
            start, end = enc.offsets[i]
            piece = tok.id_to_token(tid)
            span = text[start:end]
            if marked:  # WordPiece: "##ing" is longer than the "ing" it covers
                continues = len(piece) != len(span)
            else:  # BPE, SentencePiece: a piece not after a space continues a word
                continues = start > 0 and " " not in text[start - 1 : start + 1]
            if tid == unk:
                piece, continues = span, False
            out.append(
                {"word": piece, "scores": probs[i], "start": start, "end": end, "index": i,
                 "continues": continues}
            )  # fmt: skip
        return out

    def _label(self, token: dict) -> dict:
        best = int(token["scores"].argmax())
        return {
            "entity": self.id2label[best],
            "score": float(token["scores"][best]),
            "index": token["index"],
            "word": token["word"],
            "start": token["start"],
            "end": token["end"],
        }

    def _word(self, pieces: list[dict], strategy: str) -> dict:
        """One word's pieces as one entry, by ``strategy``."""
        if strategy == "first":
            scores = pieces[0]["scores"]
        elif strategy == "max":
            scores = max(pieces, key=lambda p: p["scores"].max())["scores"]
        else:  # average
            scores = np.nanmean(np.stack([p["scores"] for p in pieces]), axis=0)
        best = int(scores.argmax())
        return {
            "entity": self.id2label[best],
            "score": float(scores[best]),
            "word": self._join([p["word"] for p in pieces]),
            "start": pieces[0]["start"],
            "end": pieces[-1]["end"],
        }

    def _group(self, entries: list[dict]) -> dict:
        return {
            "entity_group": _tag(entries[0]["entity"])[1],
            "score": float(np.nanmean([e["score"] for e in entries])),
            "word": self._join([e["word"] for e in entries]),
            "start": entries[0]["start"],
            "end": entries[-1]["end"],
        }

    def _join(self, pieces: list[str]) -> str:
        """Pieces as text, as the folder's decoder joins them (``##`` glued)."""
        return self.bert.tokenizer.join_pieces(pieces)


def _words(tokens: list[dict]) -> list[list[dict]]:
    """Tokens cut into words: a piece that continues a word joins the one before."""
    words: list[list[dict]] = []
    for t in tokens:
        if words and t["continues"]:
            words[-1].append(t)
        else:
            words.append([t])
    return words


def _tag(label: str) -> tuple[str, str]:
    """``("B" or "I", type)`` of a label: ``B-X`` begins X, ``I-X`` and a bare ``X`` go on."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _groups(entries: list[dict]) -> list[list[dict]]:
    """Adjacent entries of one type, a ``B-`` starting a new group."""
    groups: list[list[dict]] = []
    for e in entries:
        bi, kind = _tag(e["entity"])
        if groups and bi != "B" and _tag(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def _overlaps_merged(entities: list[dict]) -> list[dict]:
    """Entities of overlapping windows, by start: of two that overlap, the longer is kept
    (the more confident when as long)."""
    out: list[dict] = []
    for e in sorted(entities, key=lambda x: x["start"]):
        if out and out[-1]["start"] <= e["start"] < out[-1]["end"]:
            last = out[-1]
            longer = e["end"] - e["start"] > last["end"] - last["start"]
            same = e["end"] - e["start"] == last["end"] - last["start"]
            if longer or (same and e["score"] > last["score"]):
                out[-1] = e
        else:
            out.append(e)
    return out
