"""``bertattn.pipeline(task, model)``: transformers' pipelines for the heads, answering with
the same dictionaries.

- ``"text-classification"`` (alias ``"sentiment-analysis"``): ``pipe(text or {"text",
  "text_pair"} or a list of them, top_k=, function_to_apply=)`` ->
  ``{"label", "score"}`` per input (or, with ``top_k``, a list per input, best first).
- ``"fill-mask"``: ``pipe(text with [MASK] or a list, top_k=5, targets=)`` ->
  ``[{"score", "token", "token_str", "sequence"}]`` best first (a list of those per mask when
  an input has several).
- ``"token-classification"`` (alias ``"ner"``): see :mod:`bertattn.heads.tagger`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..arguments import check_int, describe
from ..choices import FUNCTIONS
from ..encoder import ModelFolder, resolve_model
from .cross_encoder import CrossEncoder
from .layers import load_masked_lm_head
from .loading import load_encoder
from .pipeline_base import LOAD_KEYWORDS, Pipeline
from .registry import FILL_MASK
from .runner import run_head

logger = logging.getLogger("bertattn.heads")

__all__ = ["FillMaskPipeline", "TextClassificationPipeline", "pipeline"]

_UNSET: Any = object()


class TextClassificationPipeline(Pipeline):
    """transformers' text-classification pipeline on a ``BertForSequenceClassification``
    checkpoint (see the module docstring). ``load``: :class:`CrossEncoder`'s keywords."""

    task = "text-classification"
    OPTIONS = ("top_k", "function_to_apply", "batch_size")

    def __init__(self, model: str | Path | ModelFolder | None, **load: Any) -> None:
        self.model = CrossEncoder(model, activation_fn=torch.nn.Identity(), **load)
        self.id2label = self.model.id2label

    def default_function(self) -> str:
        """transformers' rule: none for regression, sigmoid for multi-label or one label,
        else softmax."""
        head = self.model.head
        if head.problem_type == "regression":
            return "none"
        if head.problem_type == "multi_label_classification" or head.num_labels == 1:
            return "sigmoid"
        return "softmax"

    def _call(
        self,
        inputs: str | dict | Sequence[str | dict],
        *,
        top_k: int | None = _UNSET,
        function_to_apply: str | None = None,
        batch_size: int = 32,
    ) -> Any:
        legacy = top_k is _UNSET
        if not legacy:
            top_k = check_int(top_k, "top_k", low=1, optional=True)
        fn = self.default_function() if function_to_apply is None else function_to_apply
        if not isinstance(fn, str) or fn.lower() not in FUNCTIONS:
            raise ValueError(
                f"function_to_apply must be one of {', '.join(FUNCTIONS)} (or None: the "
                f"model's default), got {describe(fn)}."
            )
        single = isinstance(inputs, (str, dict))
        if (  # transformers reads [[text, pair]] as one pair
            isinstance(inputs, list) and len(inputs) == 1 and isinstance(inputs[0], list)
            and len(inputs[0]) == 2
        ):  # fmt: skip
            inputs, single = {"text": inputs[0][0], "text_pair": inputs[0][1]}, True
        items = [inputs] if single else list(inputs)  # type: ignore[arg-type]
        logits = self.model.logits(
            [_pair(x, i) for i, x in enumerate(items)], batch_size=batch_size
        )
        scores = _apply(logits.float(), fn.lower())  # (N, C)
        out: list[Any] = []
        for row in scores:
            if legacy:
                best = int(row.argmax())
                out.append({"label": self.id2label[best], "score": float(row[best])})
                continue
            ranked = sorted(
                ({"label": self.id2label[i], "score": float(s)} for i, s in enumerate(row)),
                key=lambda d: d["score"],
                reverse=True,
            )
            out.append(ranked[:top_k])
        if single:
            return [out[0]] if legacy and isinstance(inputs, str) else out[0]
        return out


def _pair(item: object, i: int) -> tuple[str, str] | str:
    """A text, or a ``{"text", "text_pair"}`` dictionary, as :class:`CrossEncoder` input."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("text"), str) and set(item) <= {
        "text", "text_pair"
    }:  # fmt: skip
        second = item.get("text_pair")
        if second is None:
            return item["text"]
        if isinstance(second, str):
            return (item["text"], second)
    raise ValueError(
        f"input {i} is {describe(item)}; expected a text or {{'text': ..., 'text_pair': ...}}."
    )


def _apply(logits: Tensor, fn: str) -> Tensor:
    if fn == "sigmoid":
        return torch.sigmoid(logits)
    if fn == "softmax":
        return torch.softmax(logits, dim=-1)
    return logits


class FillMaskPipeline(Pipeline):
    """transformers' fill-mask pipeline on a ``BertForMaskedLM`` checkpoint (see the module
    docstring). ``load``: :meth:`bertattn.Bert.load`'s keywords."""

    OPTIONS = ("top_k", "targets", "batch_size")

    task = "fill-mask"

    def __init__(self, model: str | Path | ModelFolder | None, **load: Any) -> None:
        folder = resolve_model(model)
        self.bert, _ = load_encoder(folder, FILL_MASK, "the fill-mask pipeline", **load)
        self.head = load_masked_lm_head(folder.model_dir, folder.weight_file(), self.bert)
        self.head.to(self.bert.device)
        tok = self.bert.tokenizer
        self.mask_token = "[MASK]"
        mask_id = tok.token_to_id(self.mask_token)
        if mask_id is None:
            raise ValueError(f"{folder.model_dir}: the vocabulary has no [MASK] token.")
        self.mask_id = mask_id

    def _targets(self, targets: str | Sequence[str]) -> list[int]:
        """Vocabulary ids of ``targets`` (a word outside the vocabulary: its first piece, with
        a warning, as transformers does)."""
        names = [targets] if isinstance(targets, str) else list(targets)
        tok = self.bert.tokenizer
        ids: list[int] = []
        for t in names:
            if not isinstance(t, str):
                raise TypeError(f"targets must be strings, got {describe(t)}.")
            found = tok.token_to_id(t)
            if found is None:
                pieces = tok.token_ids([t], most=1)[0]
                if not pieces:
                    logger.warning("target %r is not in the vocabulary: ignored", t[:40])
                    continue
                found = pieces[0]
                logger.warning(
                    "target %r is not in the vocabulary: using %r", t[:40], tok.id_to_token(found)
                )
            ids.append(found)
        ids = sorted(set(ids))
        if not ids:
            raise ValueError("At least one target must be in the vocabulary when targets is given.")
        return ids

    def _call(
        self,
        inputs: str | Sequence[str],
        *,
        top_k: int = 5,
        targets: str | Sequence[str] | None = None,
        batch_size: int = 32,
    ) -> Any:
        top_k = check_int(top_k, "top_k", low=1)  # type: ignore[assignment]
        target_ids = None if targets is None else torch.tensor(self._targets(targets))
        single = isinstance(inputs, str)
        texts = [inputs] if single else list(inputs)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"inputs[{i}] must be a string, got {describe(t)}.")
        encodings = self.bert.tokenizer.encode_batch(texts, max_length=self.bert.max_length)
        where = []
        for i, enc in enumerate(encodings):
            at = [j for j, t in enumerate(enc.ids) if t == self.mask_id]
            if not at:
                raise ValueError(
                    f"input {i} has no {self.mask_token} token within its first "
                    f"{self.bert.max_length} tokens: put {self.mask_token} where a word is "
                    f"to be filled in."
                )
            where.append(at)
        hidden = run_head(self.bert, encodings, lambda h, m: h, batch_size=batch_size)
        out = []
        for enc, at, states in zip(encodings, where, hidden, strict=True):
            probs = torch.softmax(self.head(states[at].float()), dim=-1)  # (masks, V)
            out.append(self._propose(enc.ids, at, probs, top_k, target_ids))
        return out[0] if single or len(out) == 1 else out

    def _propose(
        self, ids: list[int], at: list[int], probs: Tensor, top_k: int, target_ids: Tensor | None
    ) -> list[Any]:
        """transformers' dictionaries for one input: best first, per mask."""
        if target_ids is not None:
            probs = probs[:, target_ids]
        values, picks = probs.topk(min(top_k, probs.shape[1]))
        tok = self.bert.tokenizer
        one = len(at) == 1
        rows = []
        for i, (vals, preds) in enumerate(zip(values.tolist(), picks.tolist(), strict=True)):
            row = []
            for v, p in zip(vals, preds, strict=True):
                token = int(target_ids[p]) if target_ids is not None else int(p)
                filled = list(ids)
                filled[at[i]] = token
                row.append(
                    {
                        "score": v,
                        "token": token,
                        "token_str": tok.decode([token]),
                        "sequence": tok.decode(filled, skip_special_tokens=one),
                    }
                )
            rows.append(row)
        return rows[0] if one else rows


_TASKS = {
    "text-classification": TextClassificationPipeline,
    "sentiment-analysis": TextClassificationPipeline,
    "fill-mask": FillMaskPipeline,
}


def pipeline(task: str, model: str | Path | ModelFolder | None = None, **kwargs: Any) -> Any:
    """The pipeline for ``task`` on ``model`` (a folder or a cached hub name), as
    ``transformers.pipeline`` answers. ``kwargs``: the loading's (``device``, ``dtype``,
    ``threads``, ``backend``: see :meth:`bertattn.Bert.load`) and the pipeline's own options,
    which become the defaults of every call, as transformers takes them
    (``pipeline("token-classification", model=..., aggregation_strategy="simple")``); an
    unknown keyword is refused naming both lists. Tasks: ``"text-classification"``
    (``"sentiment-analysis"``), ``"fill-mask"``, ``"token-classification"`` (``"ner"``)."""
    from .tagger import TokenClassificationPipeline

    tasks = {**_TASKS, "token-classification": TokenClassificationPipeline,
             "ner": TokenClassificationPipeline}  # fmt: skip
    if task not in tasks:
        raise ValueError(f"unknown task {describe(task)}; bertattn runs {', '.join(tasks)}.")
    cls = tasks[task]
    load = {k: v for k, v in kwargs.items() if k in LOAD_KEYWORDS}
    options = {k: v for k, v in kwargs.items() if k not in LOAD_KEYWORDS}
    unknown = [k for k in options if k not in cls.OPTIONS]
    if unknown:
        raise TypeError(
            f"pipeline({task!r}) got an unexpected keyword argument {unknown[0]!r}; the "
            f"{cls.task} pipeline takes {', '.join(cls.OPTIONS)}, and loading takes "
            f"{', '.join(LOAD_KEYWORDS)}."
        )
    if model is None:
        raise ValueError(
            f"pipeline({task!r}) needs a model: a folder (or cached hub name) of a "
            f"{'BertForMaskedLM' if task == 'fill-mask' else 'BertFor*Classification'} checkpoint."
        )
    pipe = cls(model, **load)
    pipe.set_defaults(options)
    return pipe
