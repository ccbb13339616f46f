"""``SparseEncoder``: SPLADE sparse embeddings from a BERT masked-LM checkpoint, with
sentence-transformers' ``SparseEncoder`` API.

    from bertattn import SparseEncoder
    model = SparseEncoder("naver/splade-v3")      # or a local folder
    rows = model.encode(["a text", "another"])    # (N, V) sparse COO tensor
    model.decode(rows[0], top_k=5)                 # [(token, weight), ...]

A row is ``pool over tokens of log(1 + relu(MLM logits))``. The MLM head runs at real tokens
only (never at padding) and over at most ``chunk_tokens`` tokens at a time, so memory is
O(chunk_tokens x vocabulary), not O(batch x length x vocabulary); with max pooling the
logits are max-pooled first and transformed once (the transform is monotone: the same
numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import check_bool, check_choice, check_int, describe, split_pairs
from ..encoder.st_compat import SIMILARITY_FN_NAMES
from ..engine import ModelStep
from .base import HeadSurface, check_prompts, task_encode
from .card_keywords import card_keywords
from .layers import MaskedLMHead, load_masked_lm_head
from .loading import load_encoder
from .registry import SPARSE
from .runner import head_step, run_head
from .saving import model_files, transformer_modules
from .sparse_folder import SparseSettings, read_sparse_folder
from .text_inputs import call_max_length, encode_inputs

__all__ = ["SparseEncoder"]

#: the tasks ``encode(task=...)`` takes (sentence-transformers' Router task types)
TASKS = ("query", "document")


class SparseEncoder(HeadSurface):
    """A SPLADE model (see the module docstring).

    ``model``: a ``BertForMaskedLM`` folder, a sentence-transformers ``SparseEncoder`` folder
    (MLM transformer + ``SpladePooling``), or a cached hub name. ``max_active_dims``: keep at
    most that many largest weights per row (None: all). ``device``, ``dtype``, ``threads``,
    ``backend``: as :meth:`bertattn.Bert.load`. ``chunk_tokens``: tokens whose vocabulary
    logits are held at once. The keywords model cards pass (``revision``, ``local_files_only``,
    ``cache_folder``, ``token``, ``torch_dtype``, ``model_kwargs``, ``automodel_args``,
    ``trust_remote_code``) are taken as :mod:`bertattn.heads.card_keywords` says.

    Attributes: ``bert`` (the encoder), ``head`` (:class:`MaskedLMHead`), ``settings``
    (:class:`SparseSettings`), ``prompts`` (the folder's, e.g. ``"query"``).
    """

    def __init__(
        self,
        model: str | Path | None,
        *,
        max_active_dims: int | None = None,
        device: str | int | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        threads: int | None = None,
        backend: str = "auto",
        chunk_tokens: int = 1024,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        similarity_fn_name: str | None = None,
        **card: Any,
    ) -> None:
        options = card_keywords(self, card, dtype=dtype)
        self.max_active_dims = check_int(max_active_dims, "max_active_dims", low=1, optional=True)
        self.chunk_tokens = check_int(chunk_tokens, "chunk_tokens", low=1)
        check_prompts(prompts)
        self._similarity_fn_name: str | None = None
        if similarity_fn_name is not None:
            self.similarity_fn_name = similarity_fn_name  # checked before the model loads
        folder, settings = read_sparse_folder(model, hub=options.hub)
        load = {"dtype": options.dtype, "backend": backend, "device": device, "threads": threads}
        bert, _ = load_encoder(folder, SPARSE, "a SparseEncoder (SPLADE)", **load)
        self.bert = bert
        self.settings: SparseSettings = settings
        self.head: MaskedLMHead = load_masked_lm_head(
            folder.model_dir, folder.weight_file(), bert
        ).to(bert.device)
        # the model's own prompts: yours win over the folder's, as sentence-transformers merges
        bert.prompts = {**bert.prompts, **(prompts or {})}
        if default_prompt_name is not None:
            bert.default_prompt_name = default_prompt_name
        name = bert.default_prompt_name
        if name is not None and name not in bert.prompts:
            raise ValueError(  # sentence-transformers' words, which its tests match
                f"Default prompt name {name!r} not found in the configured prompts dictionary "
                f"with keys {list(bert.prompts)}. Give default_prompt_name one of them, or pass "
                f"prompts={{{name!r}: '...'}}."
            )
        if self._similarity_fn_name is None:
            self._similarity_fn_name = settings.similarity_fn_name
        if self.max_active_dims is None:
            self.max_active_dims = settings.max_active_dims

    # ------------------------------------------------------------------ settings
    @property
    def prompts(self) -> dict[str, str]:
        """The prompts by name (the folder's ``config_sentence_transformers.json``, then
        yours); assigning a new dict takes effect on the next encode."""
        return self.bert.prompts

    @prompts.setter
    def prompts(self, value: dict[str, str]) -> None:
        if not isinstance(value, dict):
            raise TypeError(f"prompts must be a dict of names to prompt texts, got "
                            f"{describe(value)}.")  # fmt: skip
        self.bert.prompts = value

    @property
    def default_prompt_name(self) -> str | None:
        """The prompt applied when neither ``prompt`` nor ``prompt_name`` is given (None:
        none), as sentence-transformers' ``default_prompt_name``."""
        return self.bert.default_prompt_name

    @default_prompt_name.setter
    def default_prompt_name(self, value: str | None) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"default_prompt_name must be a str or None, got {describe(value)}.")
        self.bert.default_prompt_name = value

    #: the similarity functions :attr:`similarity_fn_name` takes
    SUPPORTED_SIMILARITY_FN_NAMES = SIMILARITY_FN_NAMES

    @property
    def similarity_fn_name(self) -> str:
        """The function of :meth:`similarity` and :meth:`similarity_pairwise`: ``"dot"``
        (SPLADE's, the default), ``"cosine"``, ``"euclidean"`` or ``"manhattan"``; the
        folder's ``config_sentence_transformers.json`` may set it."""
        return self._similarity_fn_name or "dot"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str | None) -> None:
        if hasattr(value, "value") and isinstance(value.value, str):  # SimilarityFunction
            value = value.value
        if value is not None and value not in SIMILARITY_FN_NAMES:
            late = (
                " (MaxSim is late interaction over token vectors: a SparseEncoder has one "
                "row per text; load a multi-vector model with bertattn.MultiVectorEncoder)"
                if isinstance(value, str) and "maxsim" in value
                else ""
            )
            raise ValueError(
                f"similarity_fn_name {str(value)[:60]!r} is not one a SparseEncoder takes{late}; "
                f"use one of {', '.join(SIMILARITY_FN_NAMES)} (or None: dot)."
            )
        self._similarity_fn_name = value

    @property
    def vocab_size(self) -> int:
        return int(self.bert.model.config.vocab_size)

    def get_embedding_dimension(self) -> int:
        """The rows' width: the vocabulary size."""
        return self.vocab_size

    def get_sentence_embedding_dimension(self) -> int:
        """:meth:`get_embedding_dimension` under sentence-transformers' older name."""
        return self.vocab_size

    def _saved_files(self) -> dict[str, Any]:
        """The prompts, default prompt, similarity, ``max_active_dims`` and max length, as
        sentence-transformers' ``SparseEncoder.save`` writes them; a plain masked-LM folder
        also gets the module list (the MLM transformer, then ``SpladePooling``)."""
        folder = self.bert.folder
        files: dict[str, Any] = model_files(folder, self.max_seq_length)
        files["config_sentence_transformers.json"] = {
            "model_type": "SparseEncoder",
            "prompts": self.prompts,
            "default_prompt_name": self.default_prompt_name,
            "similarity_fn_name": self.similarity_fn_name,
            "max_active_dims": self.max_active_dims,
        }
        if not (folder.root / "modules.json").is_file():
            files.update(_splade_modules(self.settings))
        return files

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"SparseEncoder({self.bert.name!r}, vocab={self.vocab_size}, pooling={s.pooling}, "
            f"activation={s.activation}, max_active_dims={self.max_active_dims})"
        )

    # ------------------------------------------------------------------ the rows
    def _pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """``(B, L, E)`` hidden states, ``(B, L)`` mask -> ``(B, V)`` float32 dense rows."""
        real = mask.bool()
        counts = real.sum(dim=1)  # (B,)
        flat = self.head.transform(hidden[real].float())  # (T, E): real tokens only
        text = torch.repeat_interleave(torch.arange(len(counts), device=flat.device), counts)
        vocab = self.vocab_size
        by_max = self.settings.pooling == "max"
        fill = float("-inf") if by_max else 0.0
        out = torch.full((len(counts), vocab), fill, dtype=torch.float32, device=flat.device)
        for start in range(0, flat.shape[0], self.chunk_tokens):
            logits = self.head.decode(flat[start : start + self.chunk_tokens])  # (c, V)
            idx = text[start : start + self.chunk_tokens]
            if by_max:
                out.scatter_reduce_(0, idx[:, None].expand_as(logits), logits, "amax")
            else:
                out.index_add_(0, idx, self._activate(logits))
        return self._activate(out) if by_max else out

    def step(self) -> ModelStep:
        """The engine step (:mod:`bertattn.engine`): tokenized inputs -> ``(B, V)`` dense
        rows (before ``max_active_dims``), for a batching worker such as the server's."""

        return head_step(self.bert, self._pool, "sparse")

    def _activate(self, x: Tensor) -> Tensor:
        """``log(1 + relu(x))`` (and ``log1p`` once more for ``log1p_relu``)."""
        y = torch.log1p(torch.relu(x))
        return torch.log1p(y) if self.settings.activation == "log1p_relu" else y

    def encode(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[str]] | np.ndarray | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        *,
        sentences: str | Sequence[str] | Sequence[Sequence[str]] | np.ndarray | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = True,
        convert_to_sparse_tensor: bool = True,
        save_to_cpu: bool = False,
        max_active_dims: int | None = None,
        task: str | None = None,
        processing_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> Tensor | list[Tensor]:
        """Sparse rows, as sentence-transformers' ``SparseEncoder.encode``: a ``(N, V)`` sparse
        COO tensor (``convert_to_sparse_tensor=False``: dense), a ``(V,)`` row for one string,
        or a list of rows (``convert_to_tensor=False``). ``prompt`` / ``prompt_name``: text put
        before each sentence (the folder's prompts by name). ``max_active_dims``: keep the
        largest that many weights per row (default: the model's setting). Rows are always
        computed on the model's device and returned on the CPU (``save_to_cpu`` is accepted
        for compatibility). The texts are ``inputs`` (sentence-transformers 6's name) or
        ``sentences`` (its older one), not both.

        Text pairs, as sentence-transformers' ``Transformer`` module takes them: a list of
        ``[text, pair]`` lists (or tuples), or an ``(N, 2)`` NumPy array of strings, each
        tokenized as ``[CLS] text [SEP] pair [SEP]`` (cut longest-first; a prompt goes before
        the first text). ``task``: ``"query"``, ``"document"`` or None, sentence-transformers'
        Router task; a SPLADE model here has no Router, so it changes nothing (the task's
        prompt is :meth:`encode_query` / :meth:`encode_document`'s doing).
        ``processing_kwargs={"text": {"max_length": N, "truncation": True}}``: this call's
        token limit per input (sentence-transformers' per-call tokenizer settings; other keys
        are refused by name)."""
        if (inputs is None) == (sentences is None):
            raise TypeError(
                "SparseEncoder.encode() takes the texts once: as inputs (the first argument) or "
                "as sentences=, " + ("not both." if inputs is not None else "got neither.")
            )
        sentences = inputs if sentences is None else sentences
        batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
        check_bool(show_progress_bar, "show_progress_bar", optional=True)
        check_bool(convert_to_tensor, "convert_to_tensor")
        check_bool(convert_to_sparse_tensor, "convert_to_sparse_tensor")
        check_bool(save_to_cpu, "save_to_cpu")
        keep = check_int(max_active_dims, "max_active_dims", low=1, optional=True)
        keep = self.max_active_dims if keep is None else keep
        check_choice(task, "task", TASKS, optional=True)
        limit = call_max_length(self.bert, processing_kwargs)
        texts, seconds, single = _inputs(sentences)
        if any(second is not None for second in seconds):
            self.bert._check_pairs()  # a model with one token type takes no pairs
        text = self._resolve_prompt(prompt, prompt_name)
        firsts = [text + t for t in texts] if text else texts
        vocab = self.vocab_size

        def finish(rows: Tensor) -> list[Any]:
            """One batch's ``(B, V)`` dense rows, cut to ``keep`` and kept as each row's
            non-zeros at once (views of two arrays per batch: few allocations between the
            batches' dense buffers, which the allocator can then reuse)."""
            if keep is not None:
                rows = _keep_largest(rows, keep)
            if not convert_to_sparse_tensor:
                return list(rows)
            return _row_nonzeros(rows.numpy())

        if firsts:
            encodings = encode_inputs(self.bert, firsts, seconds, limit)
            rows = run_head(
                self.bert, encodings, self._pool, batch_size=batch_size,
                show_progress_bar=bool(show_progress_bar), each=finish, fill=False,
            )  # fmt: skip
        else:
            rows = []
        return _output(rows, vocab, single, convert_to_tensor, convert_to_sparse_tensor)

    encode_query = task_encode(
        "query",
        encode,
        """:meth:`encode` with ``task="query"`` and, when neither ``prompt`` nor ``prompt_name``
        is given, the model's ``"query"`` prompt if it has one (as sentence-transformers'
        ``encode_query``; the other arguments as :meth:`encode` takes them).""",
    )
    encode_document = task_encode(
        "document",
        encode,
        """:meth:`encode` with ``task="document"`` and, when neither ``prompt`` nor
        ``prompt_name`` is given, the first of the ``"document"`` / ``"passage"`` /
        ``"corpus"`` prompts the model has (sentence-transformers' ``encode_document``).""",
    )

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """sentence-transformers' rule (``prompt`` wins, with a warning when ``prompt_name`` is
        given too; else the prompt named ``prompt_name``; else the default prompt), and its
        words for a name the model has no prompt by."""
        if prompt is None and isinstance(prompt_name, str) and prompt_name not in self.prompts:
            raise ValueError(
                f"Prompt name {prompt_name!r} not found in the configured prompts dictionary "
                f"with keys {list(self.prompts)!r}. Pass one of them as prompt_name, or the "
                f"prompt's text as prompt=."
            )
        return self.bert._resolve_prompt(prompt, prompt_name)

    # ------------------------------------------------------------------ reading rows
    def decode(
        self, embeddings: Tensor, top_k: int | None = None
    ) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """``(token, weight)`` pairs of each row's non-zero weights, largest first (at most
        ``top_k``); one list for a ``(V,)`` row, a list of lists for ``(N, V)``."""
        whole = isinstance(top_k, int) and not isinstance(top_k, bool)
        if top_k is not None and not (whole and top_k > 0):
            raise (ValueError if whole else TypeError)(
                f"top_k must be a positive integer, got {top_k!r} (None: every non-zero weight)."
            )
        rows = _as_rows(embeddings, "embeddings")
        one = embeddings.ndim == 1
        tok = self.bert.tokenizer
        out: list[list[tuple[str, float]]] = []
        for row in rows:
            nz = torch.nonzero(row, as_tuple=True)[0]
            values = row[nz]
            order = torch.argsort(values, descending=True, stable=True)
            if top_k is not None:
                order = order[:top_k]
            out.append([(tok.id_to_token(int(nz[j])), float(values[j])) for j in order])
        return out[0] if one else out

    def similarity(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N, M)`` similarities of the rows (sparse or dense) by :attr:`similarity_fn_name`:
        dot products by default (SPLADE's), cosine, or the negative euclidean / manhattan
        distance. Rows: a tensor, a NumPy array, or a list of ``(V,)`` rows (what
        ``encode(convert_to_tensor=False)`` gives; sentence-transformers' evaluators pass it)."""
        a = _as_rows(_collected(embeddings1), "embeddings1")
        b = _as_rows(_collected(embeddings2), "embeddings2")
        _same_width(a, b)
        name = self.similarity_fn_name
        if name == "cosine":
            a, b = torch.nn.functional.normalize(a, dim=1), torch.nn.functional.normalize(b, dim=1)
        if name in ("dot", "cosine"):
            return a @ b.T
        exact = "donot_use_mm_for_euclid_dist"  # a row against itself: 0, not 2e-3
        return -torch.cdist(a, b, p=2.0 if name == "euclidean" else 1.0, compute_mode=exact)

    def similarity_pairwise(self, embeddings1: object, embeddings2: object) -> Tensor:
        """``(N,)``: the similarity of each row of ``embeddings1`` with the same row of
        ``embeddings2`` (:attr:`similarity_fn_name`, as :meth:`similarity`)."""
        a = _as_rows(_collected(embeddings1), "embeddings1")
        b = _as_rows(_collected(embeddings2), "embeddings2")
        _same_width(a, b)
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"{a.shape[0]} rows and {b.shape[0]} rows; pairwise similarity "
                             f"needs as many of each.")  # fmt: skip
        name = self.similarity_fn_name
        if name == "cosine":
            a, b = torch.nn.functional.normalize(a, dim=1), torch.nn.functional.normalize(b, dim=1)
        if name in ("dot", "cosine"):
            return (a * b).sum(dim=1)
        if name == "manhattan":
            return -(a - b).abs().sum(dim=1)
        return -torch.linalg.vector_norm(a - b, dim=1)

    @staticmethod
    def intersection(embeddings_1: Tensor, embeddings_2: Tensor) -> Tensor:
        """The dimensions active in both (products of the weights, kept where positive), as
        a sparse tensor shaped like ``embeddings_2``: ``embeddings_1`` is one ``(V,)`` row,
        ``embeddings_2`` one row or ``(N, V)`` rows (sentence-transformers' ``intersection``;
        read it with :meth:`decode`)."""
        if not isinstance(embeddings_1, Tensor) or embeddings_1.ndim != 1:
            got = tuple(embeddings_1.shape) if isinstance(embeddings_1, Tensor) else None
            raise ValueError(
                f"embeddings_1 must be one (V,) row (e.g. encode_query('a text')), got "
                f"{describe(embeddings_1) if got is None else f'shape {got}'}."
            )
        b = _as_rows(embeddings_2, "embeddings_2")
        a = _as_rows(embeddings_1, "embeddings_1")
        _same_width(a, b)
        product = a * b  # (N, V)
        product = torch.where(product > 0, product, torch.zeros_like(product))
        out = product.to_sparse()
        return out[0].coalesce() if embeddings_2.ndim == 1 else out.coalesce()

    @staticmethod
    def sparsity(embeddings: Tensor) -> dict[str, float]:
        """``{"active_dims": mean non-zeros per row, "sparsity_ratio": mean share of zeros}``."""
        rows = _as_rows(embeddings, "embeddings")
        if rows.numel() == 0:
            return {"active_dims": 0.0, "sparsity_ratio": 1.0}
        active = (rows != 0).sum(dim=1).float()  # (N,)
        return {
            "active_dims": float(active.mean()),
            "sparsity_ratio": float(1 - (active / rows.shape[1]).mean()),
        }


def _splade_modules(settings: SparseSettings) -> dict[str, Any]:
    """The sentence-transformers module files of a SPLADE model saved from a plain masked-LM
    folder: the MLM transformer, then ``1_SpladePooling`` with its settings."""
    splade = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
    files = transformer_modules(
        "fill-mask", "token_embeddings", {"path": "1_SpladePooling", "type": splade}
    )
    files["1_SpladePooling/config.json"] = {
        "pooling_strategy": settings.pooling,
        "activation_function": settings.activation,
        "embedding_dimension": None,
    }
    return files


def _collected(embeddings: object) -> object:
    """A list of row tensors (sparse or dense) as one ``(N, V)`` dense tensor, a NumPy array
    as a tensor; anything else as it is (for :func:`_as_rows` to check)."""
    if isinstance(embeddings, np.ndarray) and embeddings.dtype.kind in "fiu":
        return torch.from_numpy(embeddings)
    if (
        isinstance(embeddings, (list, tuple))
        and embeddings
        and all(isinstance(t, Tensor) and t.ndim == 1 for t in embeddings)
    ):
        return torch.stack([t.to_dense() if t.is_sparse else t for t in embeddings])
    return embeddings


def _as_rows(embeddings: object, name: str) -> Tensor:
    """``(N, V)`` dense float32 rows of a 1-D or 2-D, sparse or dense tensor."""
    if not isinstance(embeddings, Tensor):
        raise TypeError(
            f"Expected torch.Tensor, got {describe(embeddings)}: {name} must be a torch.Tensor "
            f"(from encode)."
        )
    if embeddings.ndim not in (1, 2):
        raise ValueError(
            f"Input tensor must be 1D or 2D, got {embeddings.ndim}D: {name} must be one (V,) "
            f"row or (N, V) rows (1-D or 2-D), got shape {tuple(embeddings.shape)}."
        )
    dense = embeddings.to_dense() if embeddings.is_sparse else embeddings
    return dense.float().reshape(-1, dense.shape[-1])


def _same_width(a: Tensor, b: Tensor) -> None:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"rows of width {a.shape[1]} and {b.shape[1]}; give rows of one model.")


def _inputs(sentences: object) -> tuple[list[str], list[str | None], bool]:
    """``(texts, pairs, single)``: each input's text and its pair's second text (None for a
    single text). A string is one text; a list, tuple, 1-D NumPy array of strings (as
    sentence-transformers takes them) or another iterable is a batch of texts and
    ``[text, pair]`` lists / tuples; an ``(N, 2)`` NumPy array of strings is ``N`` pairs."""
    if isinstance(sentences, str):
        return [sentences], [None], True
    if isinstance(sentences, np.ndarray):
        if sentences.ndim == 0 and isinstance(sentences.item(), str):
            return [sentences.item()], [None], True
        if sentences.ndim not in (1, 2) or (sentences.ndim == 2 and sentences.shape[1] != 2):
            raise ValueError(
                f"sentences is a {sentences.ndim}-D NumPy array of shape {sentences.shape}; "
                f"pass a 1-D array (or a list) of strings, or an (N, 2) array of text pairs."
            )
        items = sentences.tolist()
    elif isinstance(sentences, (bytes, bytearray, Mapping)) or not isinstance(sentences, Iterable):
        raise TypeError(
            f"sentences must be a string or a list of strings, got {describe(sentences)}."
        )
    else:
        items = list(sentences)
    texts, seconds = split_pairs(items, _not_a_sentence)
    return texts, seconds, False


def _not_a_sentence(i: int, item: object) -> TypeError:
    return TypeError(
        f"sentences[{i}] must be a string or a [text, pair] list of two strings, got "
        f"{describe(item)}."
    )


def _row_nonzeros(rows: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each ``(V,)`` row of ``(B, V)`` as ``(columns, values)`` of its non-zeros (views)."""
    r, c = np.nonzero(rows)
    values = rows[r, c]
    bounds = np.searchsorted(r, np.arange(rows.shape[0] + 1))
    return [(c[a:b], values[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _sparse_row(cols: np.ndarray, values: np.ndarray, vocab: int) -> Tensor:
    """One ``(V,)`` sparse COO row of its non-zeros."""
    index = torch.from_numpy(cols.astype(np.int64))[None]
    return torch.sparse_coo_tensor(
        index, torch.from_numpy(values.copy()), (vocab,), check_invariants=False
    ).coalesce()


def _stack_sparse(rows: list[tuple[np.ndarray, np.ndarray]], vocab: int) -> Tensor:
    """``(N, V)`` sparse COO tensor of each row's ``(columns, values)`` (no dense ``(N, V)``)."""
    if not rows:
        return torch.zeros((0, vocab)).to_sparse()
    counts = [len(c) for c, _ in rows]
    which = np.repeat(np.arange(len(rows), dtype=np.int64), counts)
    cols = np.concatenate([c for c, _ in rows]).astype(np.int64)
    values = np.concatenate([v for _, v in rows])
    index = torch.from_numpy(np.stack([which, cols]))  # (2, nnz)
    shape = (len(rows), vocab)
    return torch.sparse_coo_tensor(
        index, torch.from_numpy(values), shape, check_invariants=False
    ).coalesce()


def _keep_largest(rows: Tensor, k: int) -> Tensor:
    """``(N, V)`` rows with all but the ``k`` largest (by magnitude) weights of each zeroed."""
    k = min(k, rows.shape[1])
    top = torch.topk(rows.abs(), k, dim=1).indices  # (N, k)
    out = torch.zeros_like(rows)
    return out.scatter_(1, top, rows.gather(1, top))


def _output(rows: list[Any], vocab: int, single: bool, tensor: bool, sparse: bool) -> Any:
    """:meth:`SparseEncoder.encode`'s answer from its rows (``(V,)`` dense rows, or each
    row's non-zero columns and values when ``sparse``): one row for a ``single`` input, else
    all; a list, or stacked into one (sparse) tensor when ``tensor``."""
    if not sparse:
        if not tensor:
            return rows[0] if single else rows
        dense = torch.stack(rows) if rows else torch.zeros((0, vocab))
        return dense[0] if single else dense
    if not tensor:
        listed = [_sparse_row(cols, values, vocab) for cols, values in rows]
        return listed[0] if single else listed
    out = _stack_sparse(rows, vocab)
    return out[0] if single else out
