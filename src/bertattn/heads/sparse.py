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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..arguments import check_bool, check_int, describe
from ..engine import ModelStep
from .layers import MaskedLMHead, load_masked_lm_head
from .loading import load_encoder
from .runner import head_step, run_head
from .sparse_folder import SparseSettings, read_sparse_folder

__all__ = ["SparseEncoder"]


class SparseEncoder:
    """A SPLADE model (see the module docstring).

    ``model``: a ``BertForMaskedLM`` folder, a sentence-transformers ``SparseEncoder`` folder
    (MLM transformer + ``SpladePooling``), or a cached hub name. ``max_active_dims``: keep at
    most that many largest weights per row (None: all). ``device``, ``dtype``, ``threads``,
    ``backend``: as :meth:`bertattn.Bert.load`. ``chunk_tokens``: tokens whose vocabulary
    logits are held at once.

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
    ) -> None:
        self.max_active_dims = check_int(max_active_dims, "max_active_dims", low=1, optional=True)
        self.chunk_tokens = check_int(chunk_tokens, "chunk_tokens", low=1)
        folder, settings = read_sparse_folder(model)
        load = {"dtype": dtype, "backend": backend, "device": device, "threads": threads}
        bert, _ = load_encoder(folder, "masked-lm", "a SparseEncoder (SPLADE)", **load)
        self.bert = bert
        self.settings: SparseSettings = settings
        self.head: MaskedLMHead = load_masked_lm_head(
            folder.model_dir, folder.weight_file(), bert
        ).to(bert.device)
        self.prompts = dict(bert.prompts)

    @property
    def vocab_size(self) -> int:
        return int(self.bert.model.config.vocab_size)

    def get_embedding_dimension(self) -> int:
        """The rows' width: the vocabulary size."""
        return self.vocab_size

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
        sentences: str | Sequence[str],
        prompt_name: str | None = None,
        prompt: str | None = None,
        *,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = True,
        convert_to_sparse_tensor: bool = True,
        save_to_cpu: bool = False,
        max_active_dims: int | None = None,
    ) -> Tensor | list[Tensor]:
        """Sparse rows, as sentence-transformers' ``SparseEncoder.encode``: a ``(N, V)`` sparse
        COO tensor (``convert_to_sparse_tensor=False``: dense), a ``(V,)`` row for one string,
        or a list of rows (``convert_to_tensor=False``). ``prompt`` / ``prompt_name``: text put
        before each sentence (the folder's prompts by name). ``max_active_dims``: keep the
        largest that many weights per row (default: the model's setting). Rows are always
        computed on the model's device and returned on the CPU (``save_to_cpu`` is accepted
        for compatibility)."""
        batch_size = check_int(batch_size, "batch_size", low=1)  # type: ignore[assignment]
        check_bool(show_progress_bar, "show_progress_bar", optional=True)
        check_bool(convert_to_tensor, "convert_to_tensor")
        check_bool(convert_to_sparse_tensor, "convert_to_sparse_tensor")
        check_bool(save_to_cpu, "save_to_cpu")
        keep = check_int(max_active_dims, "max_active_dims", low=1, optional=True)
        keep = self.max_active_dims if keep is None else keep
        single = isinstance(sentences, str)
        texts = [sentences] if single else sentences
        if not isinstance(texts, Sequence):
            raise TypeError(f"sentences must be a string or a list of strings, got "
                            f"{describe(sentences)}.")  # fmt: skip
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"sentences[{i}] must be a string, got {describe(t)}.")
        text = self.bert._resolve_prompt(prompt, prompt_name)
        inputs = [text + t for t in texts] if text else list(texts)
        if inputs:
            encodings = self.bert.tokenizer.encode_batch(inputs, max_length=self.bert.max_length)
            rows = run_head(
                self.bert, encodings, self._pool, batch_size=batch_size,
                show_progress_bar=bool(show_progress_bar),
            )  # fmt: skip
            dense = torch.stack(rows)  # (N, V)
        else:
            dense = torch.zeros((0, self.vocab_size))
        if keep is not None and dense.shape[0]:
            dense = _keep_largest(dense, keep)
        if not convert_to_tensor:
            listed = [r.to_sparse() if convert_to_sparse_tensor else r for r in dense]
            return listed[0] if single else listed
        out = dense.to_sparse() if convert_to_sparse_tensor else dense
        return out[0] if single else out

    def encode_query(self, sentences: str | Sequence[str], **kwargs: Any) -> Tensor | list[Tensor]:
        """:meth:`encode` with the folder's ``"query"`` prompt when it has one."""
        return self._encode_as("query", sentences, kwargs)

    def encode_document(
        self, sentences: str | Sequence[str], **kwargs: Any
    ) -> Tensor | list[Tensor]:
        """:meth:`encode` with the folder's ``"document"`` prompt when it has one."""
        return self._encode_as("document", sentences, kwargs)

    def _encode_as(self, name: str, sentences: Any, kwargs: dict) -> Tensor | list[Tensor]:
        if "prompt" not in kwargs and "prompt_name" not in kwargs and name in self.prompts:
            kwargs["prompt_name"] = name
        return self.encode(sentences, **kwargs)

    # ------------------------------------------------------------------ reading rows
    def decode(
        self, embeddings: Tensor, top_k: int | None = None
    ) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """``(token, weight)`` pairs of each row's non-zero weights, largest first (at most
        ``top_k``); one list for a ``(V,)`` row, a list of lists for ``(N, V)``."""
        top_k = check_int(top_k, "top_k", low=1, optional=True)
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

    def similarity(self, embeddings1: Tensor, embeddings2: Tensor) -> Tensor:
        """``(N, M)`` dot products of the rows (sparse or dense; SPLADE's similarity)."""
        a = _as_rows(embeddings1, "embeddings1")
        b = _as_rows(embeddings2, "embeddings2")
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"rows of width {a.shape[1]} and {b.shape[1]}; give rows of one "
                             f"model.")  # fmt: skip
        return a @ b.T

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


def _as_rows(embeddings: object, name: str) -> Tensor:
    """``(N, V)`` dense float32 rows of a 1-D or 2-D, sparse or dense tensor."""
    if not isinstance(embeddings, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (from encode), got {describe(embeddings)}.")
    if embeddings.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, got shape {tuple(embeddings.shape)}.")
    dense = embeddings.to_dense() if embeddings.is_sparse else embeddings
    return dense.float().reshape(-1, dense.shape[-1])


def _keep_largest(rows: Tensor, k: int) -> Tensor:
    """``(N, V)`` rows with all but the ``k`` largest (by magnitude) weights of each zeroed."""
    k = min(k, rows.shape[1])
    top = torch.topk(rows.abs(), k, dim=1).indices  # (N, k)
    out = torch.zeros_like(rows)
    return out.scatter_(1, top, rows.gather(1, top))
