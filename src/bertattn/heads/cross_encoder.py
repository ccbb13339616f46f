"""``CrossEncoder``: a BERT sequence-classification checkpoint (a reranker, a classifier)
with sentence-transformers' ``predict`` / ``rank`` API, on bertattn's encoder.

    from bertattn import CrossEncoder
    model = CrossEncoder("cross-encoder/ms-marco-MiniLM-L6-v2")   # or a local folder
    scores = model.predict([("query", "a passage"), ("query", "another")])
    model.rank("query", ["a passage", "another"], top_k=1)
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import check_bool, check_int, describe, split_pairs
from ..encoder import ModelFolder, resolve_model
from ..encoder.folder import HubOptions, locate_model, read_model_folder
from ..encoder.jsonfile import read_json_object
from ..encoder.st_compat import ST_CONFIG_FILE
from ..engine import ModelStep
from ..errors import ModelFolderError
from ..families import registry as families
from .base import HeadSurface, check_prompts
from .card_keywords import card_keywords, check_num_labels
from .config import ACTIVATIONS, HeadConfig
from .layers import FirstTokenHead, load_classifier
from .loading import load_encoder
from .registry import CROSS_ENCODER
from .runner import head_step, run_head
from .saving import model_files, transformer_modules
from .sparse_folder import refuse_other_sparse_folder
from .text_inputs import call_max_length, encode_inputs
from .weights import read_head
from .windows import pair_windows

logger = logging.getLogger("bertattn.heads")

__all__ = ["CrossEncoder"]

#: a text, or a (text, text) pair
Input = str | Sequence[str]


def _is_singular(inputs: object) -> bool:
    """sentence-transformers' ``CrossEncoder.is_singular_input``: a list / tuple is one input
    when its first element is not a list / tuple (an empty one is an empty batch); a NumPy
    array of strings (or objects) is one pair when 1-D, a batch when 2-D or more, an empty batch
    when empty; anything else (a string) is one input."""
    if isinstance(inputs, (list, tuple)):
        return len(inputs) > 0 and not isinstance(inputs[0], (list, tuple))
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return True


def _is_single(inputs: object) -> bool:
    """:func:`_is_singular`, except that an empty NumPy array of any dtype is an empty batch
    (predict's empty answer, where sentence-transformers would score one empty input)."""
    if isinstance(inputs, np.ndarray) and inputs.size == 0:
        return False
    return _is_singular(inputs)


def _folder_prompts(folder: ModelFolder) -> tuple[dict[str, str], str | None]:
    """The prompts and ``default_prompt_name`` a sentence-transformers CrossEncoder folder
    saved (``config_sentence_transformers.json``); none when it has no such file."""
    path = folder.root / ST_CONFIG_FILE
    if not path.is_file():
        return {}, None
    cfg = read_json_object(path)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in prompts.items()
    ):
        raise ModelFolderError(
            f'{path}: prompts must be an object of strings (e.g. {{"query": "query: "}}), got '
            f"{describe(prompts)}."
        )
    name = cfg.get("default_prompt_name")
    if name is not None and not isinstance(name, str):
        raise ModelFolderError(f"{path}: default_prompt_name must be a string or null, got "
                               f"{describe(name)}.")  # fmt: skip
    return {k: v or "" for k, v in prompts.items()}, name


def _reranker_folder(model: object, hub: HubOptions) -> ModelFolder:
    """The :class:`ModelFolder` of ``model`` (see :func:`resolve_model`), a sparse model that
    is not SPLADE (CSR, inference-free SPLADE) refused by name first."""
    if not isinstance(model, (str, os.PathLike)):
        return resolve_model(model, hub=hub)  # type: ignore[arg-type]  # None, a ModelFolder
    root = locate_model(model, hub=hub)
    refuse_other_sparse_folder(root, "a CrossEncoder")
    return read_model_folder(root, name=str(model))


def _deprecated_rank_keywords(kwargs: dict[str, Any]) -> None:
    """``rank()``'s keywords sentence-transformers dropped and still takes with a warning:
    ``convert_to_numpy`` / ``convert_to_tensor`` (rank returns Python floats) and
    ``apply_softmax`` (rank takes one-label models); anything else is a TypeError. The warning
    goes to the ``bertattn.heads`` logger (sentence-transformers' words, which its logger gives)
    and, as a ``FutureWarning``, to ``warnings``."""
    for name in ("convert_to_numpy", "convert_to_tensor", "apply_softmax"):
        if name in kwargs:
            kwargs.pop(name)
            why = (
                "`rank` only supports models with `num_labels=1`"
                if name == "apply_softmax"
                else "`rank` always returns Python floats"
            )
            logger.warning(
                "The CrossEncoder.rank `%s` argument is deprecated and has no effect, as %s. It "
                "will be removed in a future version.", name, why,
            )  # fmt: skip
            warnings.warn(
                f"CrossEncoder.rank's {name} argument is deprecated and has no effect, as "
                f"{why.replace('`', '')} (as in sentence-transformers); drop it.",
                FutureWarning,
                stacklevel=3,
            )
    if kwargs:
        raise TypeError(
            f"CrossEncoder.rank() got an unexpected keyword argument {next(iter(kwargs))!r}; it "
            f"takes top_k, return_documents, prompt_name, prompt, batch_size, "
            f"show_progress_bar, activation_fn, max_tokens_per_doc."
        )


def _split(inputs: Sequence[object]) -> tuple[list[str], list[str | None]]:
    """Each input as ``(text, second text or None)``; a clear error for anything else."""
    return split_pairs(inputs, _not_an_input, one_text_lists=True)


def _not_an_input(i: int, item: object) -> ValueError:
    return ValueError(
        f"input {i} is {describe(item)}; expected a text or a (text, text) pair, e.g. "
        f"[('query', 'passage'), ...]. A flat list of strings is read as one input (as "
        f"sentence-transformers reads it): wrap single texts as [[text], ...]."
    )


class CrossEncoder(HeadSurface):
    """A sequence-classification BERT checkpoint scoring texts and text pairs.

    ``model``: a folder saved by transformers' ``BertForSequenceClassification`` or by
    sentence-transformers' ``CrossEncoder`` (or a cached hub name); its ``config.json`` must
    name that architecture. ``max_length``: tokens per input (default: the folder's);
    ``activation_fn``: applied to the logits by :meth:`predict` (default: the folder's
    sentence-transformers setting, else sigmoid for one label and none for several);
    ``device``, ``dtype``, ``threads``, ``backend``: as :meth:`bertattn.Bert.load`.
    ``prompts`` / ``default_prompt_name``: as sentence-transformers' (merged over the
    folder's ``config_sentence_transformers.json``; a prompt goes before the first text of
    each pair). The keywords model cards pass (``revision``, ``local_files_only``,
    ``cache_folder``, ``token``, ``torch_dtype``, ``model_kwargs``, ``automodel_args``,
    ``trust_remote_code``, ``num_labels``) are taken as :mod:`bertattn.heads.card_keywords`
    says.

    Attributes: ``bert`` (the encoder, a :class:`bertattn.Bert`), ``head`` (its
    :class:`HeadConfig`), ``classifier`` (``nn.Linear(E, num_labels)``), ``num_labels``,
    ``id2label``, ``activation_fn`` (a ``torch.nn`` module unless you gave a function),
    ``prompts``, ``default_prompt_name``.
    """

    #: ``num_labels=`` is taken (checked against the folder's head)
    TAKES_NUM_LABELS = True

    def __init__(
        self,
        model: str | Path | ModelFolder | None,
        *,
        max_length: int | None = None,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
        device: str | int | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        threads: int | None = None,
        backend: str = "auto",
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        **card: Any,
    ) -> None:
        options = card_keywords(self, card, dtype=dtype)
        if activation_fn is not None and not callable(activation_fn):
            raise TypeError(f"activation_fn must be callable, got {describe(activation_fn)}.")
        check_prompts(prompts)
        folder = _reranker_folder(model, options.hub)
        saved, saved_default = _folder_prompts(folder)
        #: the prompts by name: the folder's, then yours over them
        self.prompts: dict[str, str] = {**saved, **(prompts or {})}
        #: the prompt applied when neither ``prompt`` nor ``prompt_name`` is given
        self.default_prompt_name: str | None = (
            default_prompt_name if default_prompt_name is not None else saved_default
        )
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(
                f"default_prompt_name {self.default_prompt_name!r} is not among the prompts "
                f"{list(self.prompts)}; name one of them, or pass prompts="
                f"{{{self.default_prompt_name!r}: '...'}}."
            )
        load = {"dtype": options.dtype, "backend": backend, "device": device, "threads": threads}
        bert, head = load_encoder(folder, CROSS_ENCODER, "a CrossEncoder", **load)
        check_num_labels(options.num_labels, head.num_labels, folder.config_path)
        family = bert.model.config.family
        record = families.get(family)
        own = record.heads.get("sequence-classification")
        first = record.first_token_layer
        if own is None and first is None and bert.model.pooler is None:
            raise ModelFolderError(
                f"{folder.weight_file()}: no pooler weights (bert.pooler.dense.*), which a "
                f"sequence classifier runs on [CLS]; the checkpoint is incomplete."
            )
        if max_length is not None:
            bert.max_seq_length = check_int(max_length, "max_length", low=3)  # type: ignore[assignment]
        width = bert.model.config.hidden_size
        n = head.num_labels
        weights = folder.weight_file()
        self.bert = bert
        self.head: HeadConfig = head
        #: the family's own first-token layer and classifier (DistilBERT, ELECTRA), else None:
        #: the encoder's pooler, then :attr:`classifier`
        self.first_token: FirstTokenHead | None = None
        #: the family's own head (ModernBERT's: pooling and a prediction head), else None
        self.family_head: torch.nn.Module | None = None
        if own is not None:
            expected = own.expected(bert.model.config, n)
            tensors = read_head(
                weights, expected, f"sequence-classification head ({n} labels)",
                pooler="pooler.dense.weight" in expected,  # DeBERTa's ContextPooler
            )  # fmt: skip
            self.family_head = own.build(bert.model.config, n, tensors).to(bert.device)
            classifier = self.family_head.classifier  # type: ignore[assignment]
        elif first is not None:
            self.first_token = FirstTokenHead.load(weights, first, width, n).to(bert.device)
            classifier = self.first_token.classifier
        else:
            classifier = load_classifier(weights, width, n, "sequence-classification")
        self.classifier = classifier.eval().to(bert.device)
        self.num_labels = n
        self.id2label = dict(head.id2label)
        self.activation_fn: Callable[[Tensor], Tensor] = (
            activation_fn if activation_fn is not None else head.default_activation()
        )

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """sentence-transformers' rule: ``prompt`` wins (a warning when ``prompt_name`` is
        given too), else the prompt named ``prompt_name``, else the default prompt, else
        none."""
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or None, got {describe(prompt)}.")
        if prompt_name is not None and not isinstance(prompt_name, str):
            raise TypeError(f"prompt_name must be a str or None, got {describe(prompt_name)}.")
        return self.choose_prompt(
            prompt,
            prompt_name,
            "prompt_name {name!r} is not among this model's prompts {names}; name one of them, "
            "or give the text as prompt=.",
        )

    @staticmethod
    def is_singular_input(inputs: object) -> bool:
        """Whether ``inputs`` is one input (a text, one pair) rather than a batch, as
        sentence-transformers' ``CrossEncoder.is_singular_input`` decides: a list / tuple whose
        first element is not a list / tuple is one; a 1-D NumPy array of strings is one pair, a
        2-D one a batch of pairs, an empty one an empty batch; a string is one."""
        return _is_singular(inputs)

    # ------------------------------------------------------------------ settings
    @property
    def max_length(self) -> int:
        """Tokens per input (the pair's together), [CLS] and [SEP] included."""
        return self.bert.max_length

    @property
    def default_activation_function(self) -> torch.nn.Module:
        """:meth:`get_default_activation_fn` under its old name (deprecated, as in
        sentence-transformers)."""
        warnings.warn(
            "The `default_activation_function` property was renamed and is now deprecated; use "
            "`get_default_activation_fn()` (or `activation_fn`, the one predict uses).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.get_default_activation_fn()

    def get_default_activation_fn(self) -> torch.nn.Module:
        """The activation the folder names, else ``nn.Sigmoid()`` for one label and
        ``nn.Identity()`` for several (a new module; :attr:`activation_fn` is the one used)."""
        return self.head.default_activation()

    def _saved_files(self) -> dict[str, Any]:
        """The prompts, default prompt, activation (by its torch name) and max length, as
        sentence-transformers' ``CrossEncoder.save`` writes them; a plain Hugging Face folder
        also gets its module list."""
        act = self.activation_fn
        name = f"{type(act).__module__}.{type(act).__qualname__}"
        st: dict[str, Any] = {"model_type": "CrossEncoder", "prompts": self.prompts,
                              "default_prompt_name": self.default_prompt_name}  # fmt: skip
        if name in ACTIVATIONS:
            st["activation_fn"] = name
        else:
            logger.warning(
                "CrossEncoder.save: activation_fn %r is not one a folder can name "
                "(torch.nn.Sigmoid, Identity or Tanh); the saved folder keeps its own.", act
            )  # fmt: skip
        folder = self.bert.folder
        files = {"config_sentence_transformers.json": st, **model_files(folder, self.max_length)}
        if not (folder.root / "modules.json").is_file():  # else its prompts would not be read
            files.update(transformer_modules("sequence-classification", "scores"))
        return files

    def __repr__(self) -> str:
        return (
            f"CrossEncoder({self.bert.name!r}, num_labels={self.num_labels}, "
            f"max_length={self.max_length}, device={self.device})"
        )

    # ------------------------------------------------------------------ scoring
    def logits(
        self,
        inputs: Sequence[Input],
        *,
        batch_size: int = 32,
        prompt: str | None = None,
        max_length: int | None = None,
    ) -> Tensor:
        """``(N, num_labels)`` float32 logits of the inputs (texts or pairs), as transformers'
        ``BertForSequenceClassification`` gives them; ``prompt``: put before each input's
        first text; ``max_length``: tokens per input (default :attr:`max_length`)."""
        firsts, seconds = _split(inputs)
        if prompt:
            firsts = [prompt + t for t in firsts]
        limit = self.max_length if max_length is None else max_length
        return self._logits(encode_inputs(self.bert, firsts, seconds, limit), batch_size)

    def _logits(self, encodings: Sequence[Any], batch_size: int) -> Tensor:
        """``(N, num_labels)`` float32 logits of tokenized inputs."""
        if not encodings:
            return torch.zeros((0, self.num_labels))
        return torch.stack(run_head(self.bert, encodings, self._head, batch_size=batch_size))

    def _head(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """``(B, L, E)`` hidden states -> ``(B, num_labels)`` logits: the pooler (dense + tanh
        on [CLS]), then the classifier; or the family's own first-token head."""
        if self.family_head is not None:
            return self.family_head(hidden, mask)
        if self.first_token is not None:
            return self.first_token(hidden)
        return self.classifier(self.bert.model.pooler(hidden).float())

    def step(self) -> ModelStep:
        """The engine step (:mod:`bertattn.engine`): tokenized inputs (texts or pairs) ->
        ``(B, num_labels)`` logits, for a batching worker such as the server's."""

        return head_step(self.bert, self._head, "scores")

    def predict(
        self,
        inputs: Sequence[Input] | Input,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        *,
        processing_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> np.ndarray | Tensor | list[Tensor]:
        """Scores, as sentence-transformers' ``CrossEncoder.predict``: ``(N,)`` for one label,
        ``(N, num_labels)`` for several; a single input (a text, or one pair) gives one score
        (row). ``activation_fn`` (default :attr:`activation_fn`) is applied to the logits,
        then a softmax over labels when ``apply_softmax``. A float32 NumPy array (default),
        one tensor (``convert_to_tensor``), or a list of tensors (neither). ``prompt`` /
        ``prompt_name``: text put before each pair's first text (the model's prompts by name;
        neither: its ``default_prompt_name``'s, if set). A NumPy array of strings: 1-D is one
        pair, 2-D a batch of pairs (as sentence-transformers reads them).
        ``processing_kwargs={"text": {"max_length": N, "truncation": True}}``: this call's token
        limit per input (sentence-transformers' per-call tokenizer settings; other keys are
        refused by name)."""
        batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
        check_bool(show_progress_bar, "show_progress_bar", optional=True)
        apply_softmax = check_bool(apply_softmax, "apply_softmax", optional=True)
        check_bool(convert_to_numpy, "convert_to_numpy")
        check_bool(convert_to_tensor, "convert_to_tensor")
        if activation_fn is not None and not callable(activation_fn):
            raise TypeError(f"activation_fn must be callable, got {describe(activation_fn)}.")
        limit = call_max_length(self.bert, processing_kwargs)
        single = _is_single(inputs)
        if isinstance(inputs, np.ndarray):
            inputs = inputs.tolist()
        batch = [inputs] if single else list(inputs)  # type: ignore[arg-type]
        text = self._resolve_prompt(prompt, prompt_name)
        if not batch:  # sentence-transformers' empty answer
            empty = torch.tensor([])
            return empty if convert_to_tensor else (empty.numpy() if convert_to_numpy else [])
        scores = self.logits(batch, batch_size=batch_size, prompt=text, max_length=limit)
        fn = self.activation_fn if activation_fn is None else activation_fn
        scores = fn(scores)
        if self.num_labels == 1 and scores.ndim > 1:
            scores = scores.squeeze(-1)  # (N,)
        if apply_softmax and scores.ndim > 1:
            scores = torch.softmax(scores, dim=1)
        out: np.ndarray | Tensor | list[Tensor]
        if convert_to_tensor:
            out = scores
        elif convert_to_numpy:
            out = scores.float().numpy()
        else:
            out = list(scores)
        return out[0] if single else out

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
        *,
        max_tokens_per_doc: int | None = None,
        **deprecated: Any,
    ) -> list[dict[str, Any]]:
        """The documents best first for ``query``, as sentence-transformers' ``rank``:
        ``[{"corpus_id", "score", "text"?}]`` (``text`` with ``return_documents``), the first
        ``top_k`` (None: all). Needs a one-label model (a reranker).

        ``max_tokens_per_doc``: a document longer than that many tokens (or than the window
        left beside the query) is not cut: it is scored in overlapping windows of that many of
        its tokens (a quarter overlapping) and takes its best window's score, so a passage
        deep in a long document still counts. None: each pair cut at ``max_length``.
        ``prompt`` / ``prompt_name``: as :meth:`predict` (before the query). The keywords
        sentence-transformers deprecated here (``convert_to_numpy``, ``convert_to_tensor``,
        ``apply_softmax``) are taken with a ``FutureWarning`` and have no effect."""
        _deprecated_rank_keywords(deprecated)
        if self.num_labels != 1:
            raise ValueError(
                f"CrossEncoder.rank() only works for models with num_labels=1. Consider using "
                f"CrossEncoder.predict() with input pairs instead. (rank() needs a model with one "
                f"label, a reranker; this one has {self.num_labels}: "
                f"{', '.join(self.id2label.values())}.)"
            )
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {describe(query)}.")
        if isinstance(documents, str) or not isinstance(documents, Sequence):
            raise TypeError(f"documents must be a list of strings, got {describe(documents)}.")
        for i, doc in enumerate(documents):
            if not isinstance(doc, str):
                raise TypeError(f"documents[{i}] must be a string, got {describe(doc)}.")
        top_k = check_int(top_k, "top_k", low=1, optional=True)
        window = check_int(max_tokens_per_doc, "max_tokens_per_doc", low=1, optional=True)
        check_bool(return_documents, "return_documents")
        if not documents:
            return []
        text = self._resolve_prompt(prompt, prompt_name)
        if window is None:
            scores = self.predict(
                [(query, doc) for doc in documents],
                prompt=text,
                batch_size=batch_size,
                show_progress_bar=show_progress_bar,
                activation_fn=activation_fn,
                convert_to_tensor=True,
            ).tolist()  # type: ignore[union-attr]
        else:
            query = text + query if text else query
            scores = self._best_windows(query, documents, window, batch_size, activation_fn)
        results: list[dict[str, Any]] = []
        for i, score in enumerate(scores):
            row: dict[str, Any] = {"corpus_id": i, "score": score}
            if return_documents:
                row["text"] = documents[i]
            results.append(row)
        results.sort(key=lambda r: r["score"], reverse=True)
        return results[:top_k]

    def _best_windows(
        self,
        query: str,
        documents: Sequence[str],
        window: int,
        batch_size: int,
        activation_fn: Callable[[Tensor], Tensor] | None,
    ) -> list[float]:
        """Each document's best window score (see :meth:`rank`)."""
        tok = self.bert.tokenizer
        owner: list[int] = []
        encodings: list[Any] = []
        for i, doc in enumerate(documents):
            parts = pair_windows(tok, query, doc, max_length=self.max_length, doc_tokens=window)
            encodings += parts
            owner += [i] * len(parts)
        fn = self.activation_fn if activation_fn is None else activation_fn
        scores = fn(self._logits(encodings, batch_size))[:, 0]  # (windows,)
        best = torch.full((len(documents),), float("-inf"))
        best.scatter_reduce_(0, torch.tensor(owner), scores.float(), "amax")
        return best.tolist()
