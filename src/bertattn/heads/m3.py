"""bge-m3's three outputs from one forward, as FlagEmbedding's ``BGEM3FlagModel`` gives them.

A bge-m3 folder is an XLM-RoBERTa checkpoint (any encoder bertattn loads will do) with two
linear layers beside its weights, each a ``torch.save``'d state dict read with
``torch.load(weights_only=True)`` (tensors only, no code): ``colbert_linear.pt`` (``weight``
``(C, E)``, ``bias`` ``(C,)``) and ``sparse_linear.pt`` (``weight`` ``(1, E)``, ``bias`` ``(1,)``).
From the last hidden states ``h`` of a text's tokens:

- ``dense_vecs``: ``h[0]`` (the first token; ``pooling_method="mean"``: the mean), L2-normalized;
- ``lexical_weights``: ``relu(sparse_linear(h_t))`` per token, the largest per token id, for
  ids other than the tokenizer's cls / eos / pad / unk tokens and weights above 0, as
  ``{str(token_id): weight}`` in the order the ids first occur;
- ``colbert_vecs``: ``colbert_linear(h[1:])`` (every real token after the first, the last
  ``</s>`` included), each row L2-normalized.

Scores as ``BGEM3FlagModel``: dense = dot product, sparse = sum over shared ids of the weights'
products, ColBERT = the mean over query rows of their best passage row. One difference, on
purpose: batches are padding-free, so in :meth:`M3Encoder.compute_score` a passage's padding
never takes part in ColBERT's max (FlagEmbedding's batched ``compute_score`` scores the zero
rows of padding too, which wins where every real row of the passage scores below zero).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..arguments import (
    ArgumentTypeError,
    check_bool,
    check_choice,
    check_int,
    describe,
    is_text_pair,
)
from ..encoder import Bert
from ..encoder.folder import resolve_model
from ..encoder.jsonfile import ModelFolderNotFoundError
from ..encoder.st_compat import text_list
from ..encoder.tokenizer import read_tokenizer_config
from ..errors import ModelFolderError
from .runner import token_batches

logger = logging.getLogger("bertattn.heads")

__all__ = ["M3Encoder", "read_linear"]

POOLINGS = ("cls", "mean")
OUTPUT_KEYS = ("dense_vecs", "lexical_weights", "colbert_vecs")
SCORE_KEYS = ("colbert", "sparse", "dense", "sparse+dense", "colbert+sparse+dense")


def read_linear(path: Path, width: int, out: int | None) -> tuple[Tensor, Tensor]:
    """``weight`` ``(out, width)`` and ``bias`` ``(out,)`` float32 of a ``torch.save``'d
    ``nn.Linear`` state dict (``out`` None: any). Read with ``weights_only=True``."""
    if not path.is_file():
        raise ModelFolderNotFoundError(
            f"{path} is missing: a bge-m3 folder holds colbert_linear.pt and sparse_linear.pt "
            f"beside the encoder's weights (FlagEmbedding saves them there)."
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a damaged file, or one holding more than tensors
        raise ModelFolderError(
            f"{path}: cannot be read as a state dict of tensors ({type(exc).__name__}: "
            f"{str(exc)[:200]}); it must hold an nn.Linear's 'weight' and 'bias'."
        ) from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ModelFolderError(
            f"{path}: expected an nn.Linear state dict with 'weight' and 'bias', got {got}."
        )
    weight, bias = state["weight"], state["bias"]
    rows = weight.shape[0] if out is None and weight.ndim == 2 else out
    if tuple(weight.shape) != (rows, width) or tuple(bias.shape) != (rows,):
        raise ModelFolderError(
            f"{path}: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} do not fit an "
            f"encoder of hidden size {width}: expected ({'C' if out is None else out}, {width}) "
            f"and ({'C' if out is None else out},)."
        )
    return weight.float(), bias.float()


class M3Encoder:
    """A bge-m3 model (see the module docstring), with ``BGEM3FlagModel``'s methods.

    ``model``: the folder (or a cached hub name); ``normalize_embeddings`` (default True) and
    ``pooling_method`` (``"cls"`` or ``"mean"``) as FlagEmbedding's; ``batch_size``,
    ``query_max_length``, ``passage_max_length``, ``return_*`` and ``truncate_dim``: the
    defaults of :meth:`encode`; ``device``, ``dtype``, ``threads``, ``backend``: as
    :meth:`bertattn.Bert.load` (``dtype="int8"``: the encoder's products in int8, checked
    against float32 as it loads; the two linear layers stay float32).

    Attributes: ``bert`` (the encoder), ``colbert_dim``, ``unused_token_ids`` (the ids left out
    of the lexical weights).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        normalize_embeddings: bool = True,
        pooling_method: str = "cls",
        batch_size: int = 256,
        query_max_length: int = 512,
        passage_max_length: int = 512,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
        truncate_dim: int | None = None,
        device: str | int | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        threads: int | None = None,
        backend: str = "auto",
    ) -> None:
        if not isinstance(model, (str, Path)):
            raise ArgumentTypeError(
                f"model must be a bge-m3 folder (str or Path) or a cached hub name, got "
                f"{describe(model)}."
            )
        self.normalize_embeddings = bool(check_bool(normalize_embeddings, "normalize_embeddings"))
        self.pooling_method = check_choice(pooling_method, "pooling_method", POOLINGS)
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.query_max_length = check_int(query_max_length, "query_max_length", low=3)
        self.passage_max_length = check_int(passage_max_length, "passage_max_length", low=3)
        self.return_dense = bool(check_bool(return_dense, "return_dense"))
        self.return_sparse = bool(check_bool(return_sparse, "return_sparse"))
        self.return_colbert_vecs = bool(check_bool(return_colbert_vecs, "return_colbert_vecs"))
        self.truncate_dim = check_int(truncate_dim, "truncate_dim", low=1, optional=True)
        folder = resolve_model(model)
        width = folder.config.hidden_size
        colbert = read_linear(folder.model_dir / "colbert_linear.pt", width, None)
        sparse = read_linear(folder.model_dir / "sparse_linear.pt", width, 1)
        with warnings.catch_warnings():  # int8's check encodes; this class pools on its own
            warnings.filterwarnings("ignore", message=r".*no modules\.json \(a plain Hugging Face")
            self.bert = Bert.load(
                folder, dtype=dtype, device=device, threads=threads, backend=backend
            )
        where = self.bert.device
        self._colbert = (colbert[0].to(where), colbert[1].to(where))
        self._sparse = (sparse[0].to(where), sparse[1].to(where))
        self.colbert_dim = int(colbert[0].shape[0])
        self.unused_token_ids = self._unused_ids(folder.model_dir)

    def _unused_ids(self, model_dir: Path) -> set[int]:
        """The ids of the tokenizer's cls / eos / pad / unk tokens (those it names)."""
        path = model_dir / "tokenizer_config.json"
        cfg = read_tokenizer_config(path) if path.is_file() else {}
        out = set()
        for key in ("cls_token", "eos_token", "pad_token", "unk_token"):
            token = cfg.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            found = self.bert.tokenizer.token_to_id(token) if isinstance(token, str) else None
            if found is not None:
                out.add(int(found))
        return out

    @property
    def tokenizer(self) -> Any:
        return self.bert.tokenizer

    def __repr__(self) -> str:
        return (
            f"M3Encoder({self.bert.name!r}, hidden={self.bert.model.config.hidden_size}, "
            f"colbert_dim={self.colbert_dim}, pooling={self.pooling_method})"
        )

    # ------------------------------------------------------------------ encoding
    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool | None = None,
        return_sparse: bool | None = None,
        return_colbert_vecs: bool | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """``{"dense_vecs", "lexical_weights", "colbert_vecs"}`` as ``BGEM3FlagModel.encode``
        gives them, from one forward per batch: ``dense_vecs`` a ``(N, E)`` float32 array,
        ``lexical_weights`` a list of ``{str(token_id): weight}`` dicts (Python floats),
        ``colbert_vecs`` a list of ``(n_i - 1, C)`` float32 arrays (``n_i``: the text's tokens);
        an output not asked for is None; one str gives one row / dict / array. ``max_length``:
        tokens kept (default ``passage_max_length``); the ``return_*`` flags default to the
        constructor's."""
        if kwargs:
            raise ValueError(
                f"M3Encoder.encode() got keyword argument(s) it does not take: "
                f"{', '.join(sorted(kwargs))} (it takes batch_size, max_length, return_dense, "
                f"return_sparse, return_colbert_vecs)."
            )
        batch_size = check_int(batch_size, "batch_size", low=1, optional=True) or self.batch_size
        limit = check_int(max_length, "max_length", low=3, optional=True)
        limit = min(limit or self.passage_max_length, self.bert.max_length)
        flags = {}
        for name, value in (
            ("return_dense", return_dense),
            ("return_sparse", return_sparse),
            ("return_colbert_vecs", return_colbert_vecs),
        ):
            given = check_bool(value, name, optional=True)
            flags[name] = getattr(self, name) if given is None else given
        if not any(flags.values()):
            raise ValueError(
                "return_dense, return_sparse and return_colbert_vecs are all False: ask for at "
                "least one output."
            )
        texts, single = text_list(sentences, "sentences")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ArgumentTypeError(f"sentences[{i}] must be a str, got {describe(t)}.")
        lexical: list[dict[str, float] | None] = [None] * len(texts)
        colbert: list[np.ndarray | None] = [None] * len(texts)
        dense_rows = np.zeros((len(texts), self._dense_width()), dtype=np.float32)
        with torch.inference_mode():  # cut at max_length, as FlagEmbedding cuts
            for idx, encodings in token_batches(self.bert, texts, batch_size, limit):
                out = self._batch(encodings, **flags)
                if "dense" in out:
                    dense_rows[idx] = out["dense"]
                for j, i in enumerate(idx):
                    if "lexical" in out:
                        lexical[i] = out["lexical"][j]
                    if "colbert" in out:
                        colbert[i] = out["colbert"][j]
        result: dict[str, Any] = {
            "dense_vecs": dense_rows if flags["return_dense"] else None,
            "lexical_weights": lexical if flags["return_sparse"] else None,
            "colbert_vecs": colbert if flags["return_colbert_vecs"] else None,
        }
        if single:
            result = {k: None if v is None else v[0] for k, v in result.items()}
        return result

    def encode_queries(self, queries: str | Sequence[str], **kwargs: Any) -> dict[str, Any]:
        """:meth:`encode` with ``max_length`` defaulting to ``query_max_length``."""
        kwargs.setdefault("max_length", self.query_max_length)
        return self.encode(queries, **kwargs)

    def encode_corpus(self, corpus: str | Sequence[str], **kwargs: Any) -> dict[str, Any]:
        """:meth:`encode` with ``max_length`` defaulting to ``passage_max_length``."""
        kwargs.setdefault("max_length", self.passage_max_length)
        return self.encode(corpus, **kwargs)

    def _dense_width(self) -> int:
        width = self.bert.model.config.hidden_size
        return width if self.truncate_dim is None else min(width, self.truncate_dim)

    def _batch(
        self,
        encodings: Sequence[Any],
        *,
        return_dense: bool,
        return_sparse: bool,
        return_colbert_vecs: bool,
    ) -> dict[str, Any]:
        """One batch through the encoder once; each asked output from the same hidden states."""
        batch, mask, hidden = self.bert.forward_encodings(encodings)  # hidden (B, L, E)
        real = mask.bool()  # (B, L)
        counts = real.sum(1).tolist()  # (B,)
        out: dict[str, Any] = {}
        norm = self.normalize_embeddings
        if return_dense:
            if self.pooling_method == "cls":
                emb = hidden[:, 0].float()  # (B, E)
            else:
                m = real.unsqueeze(-1).float()  # (B, L, 1)
                emb = (hidden.float() * m).sum(1) / m.sum(1)
            if self.truncate_dim is not None:
                emb = emb[:, : self.truncate_dim]
            if norm:
                emb = torch.nn.functional.normalize(emb, dim=-1)
            out["dense"] = emb.cpu().numpy()
        if return_sparse:
            w, b = self._sparse
            flat = hidden[real].float()  # (T, E): real tokens only
            weights = torch.relu(flat @ w.T + b).squeeze(-1).cpu().numpy()  # (T,)
            ids = batch.input_ids[real.cpu()].tolist()  # (T,)
            out["lexical"] = self._lexical(ids, weights, counts)
        if return_colbert_vecs:
            w, b = self._colbert
            after_first = real.clone()
            after_first[:, 0] = False  # colbert_linear(h[1:])
            vecs = hidden[after_first].float() @ w.T + b  # (T - B, C)
            if self.truncate_dim is not None:
                vecs = vecs[:, : self.truncate_dim]
            if norm:
                vecs = torch.nn.functional.normalize(vecs, dim=-1)
            rows = vecs.cpu().numpy()
            ends = np.cumsum([n - 1 for n in counts])
            out["colbert"] = np.split(rows, ends[:-1])  # views into one array
        return out

    def _lexical(
        self, ids: list[int], weights: np.ndarray, counts: list[int]
    ) -> list[dict[str, float]]:
        """Per text: ``{str(id): its largest weight}`` over its tokens, unused ids and weights
        <= 0 left out, in the order the ids first occur."""
        unused = self.unused_token_ids
        out, start = [], 0
        for n in counts:
            found: dict[str, float] = {}
            pieces = zip(ids[start : start + n], weights[start : start + n].tolist(), strict=True)
            for token, weight in pieces:
                if token in unused or weight <= 0:
                    continue
                key = str(token)
                if weight > found.get(key, 0.0):
                    found[key] = weight
            out.append(found)
            start += n
        return out

    # ------------------------------------------------------------------ scores
    @staticmethod
    def compute_lexical_matching_score(lexical_weights_1: Any, lexical_weights_2: Any) -> Any:
        """Sum over the token ids both hold of their weights' product: a float for two dicts,
        a ``(N, M)`` array for two lists of them."""
        if isinstance(lexical_weights_1, dict) and isinstance(lexical_weights_2, dict):
            return float(
                sum(
                    w * lexical_weights_2[t]
                    for t, w in lexical_weights_1.items()
                    if t in lexical_weights_2
                )
            )
        if isinstance(lexical_weights_1, list) and isinstance(lexical_weights_2, list):
            return np.array(
                [
                    [M3Encoder.compute_lexical_matching_score(a, b) for b in lexical_weights_2]
                    for a in lexical_weights_1
                ]
            )
        raise ArgumentTypeError(
            f"lexical weights must be two dicts or two lists of dicts (encode's "
            f"'lexical_weights'), got {describe(lexical_weights_1)} and "
            f"{describe(lexical_weights_2)}."
        )

    @staticmethod
    def colbert_score(q_reps: Any, p_reps: Any) -> Tensor:
        """The mean over the query's rows of each one's best dot product with a passage row
        (a 0-d float tensor, as FlagEmbedding's)."""
        q, p = torch.as_tensor(np.asarray(q_reps)), torch.as_tensor(np.asarray(p_reps))
        if q.ndim != 2 or p.ndim != 2 or q.shape[1] != p.shape[1]:
            raise ValueError(
                f"colbert_score takes two (tokens, dim) arrays of one width (encode's "
                f"'colbert_vecs' rows), got {tuple(q.shape)} and {tuple(p.shape)}."
            )
        return (q @ p.T).max(-1).values.sum() / q.shape[0]

    def convert_id_to_token(self, lexical_weights: Any) -> Any:
        """Lexical weights keyed by the token's text instead of its id (a dict, or a list of
        them)."""
        single = isinstance(lexical_weights, dict)
        items = [lexical_weights] if single else list(lexical_weights)
        out = [{self.bert.tokenizer.decode([int(k)]): v for k, v in d.items()} for d in items]
        return out[0] if single else out

    def compute_score(
        self,
        sentence_pairs: Sequence[tuple[str, str]] | tuple[str, str],
        batch_size: int = 256,
        max_query_length: int = 512,
        max_passage_length: int = 512,
        weights_for_different_modes: Sequence[float] | None = None,
    ) -> dict[str, Any]:
        """``{"colbert", "sparse", "dense", "sparse+dense", "colbert+sparse+dense"}``: a list
        of floats per key, one per (query, passage) pair (one pair: floats), as
        ``BGEM3FlagModel.compute_score``. ``weights_for_different_modes``: the weights of
        dense, sparse and ColBERT (default ``[1, 1, 1]``); ``"sparse+dense"`` is their
        weighted mean of those two, the last key of all three."""
        if isinstance(sentence_pairs, list) and not sentence_pairs:
            return {}  # type: ignore[return-value]
        if isinstance(sentence_pairs, (str, bytes)) or not isinstance(
            sentence_pairs, (list, tuple)
        ):
            raise ArgumentTypeError(
                f"sentence_pairs must be a (query, passage) pair or a list of them, got "
                f"{describe(sentence_pairs)}."
            )
        single = bool(sentence_pairs) and isinstance(sentence_pairs[0], str)  # as FlagEmbedding
        pairs = [sentence_pairs] if single else list(sentence_pairs)
        for i, pair in enumerate(pairs):
            if not is_text_pair(pair):
                raise ArgumentTypeError(
                    f"sentence_pairs[{i}] must be a (query, passage) pair of str, got "
                    f"{describe(pair)}."
                )
        w = (
            [1.0, 1.0, 1.0]
            if weights_for_different_modes is None
            else list(weights_for_different_modes)
        )
        if len(w) != 3:
            raise ValueError(
                f"weights_for_different_modes must hold 3 weights (dense, sparse, colbert), got "
                f"{len(w)}: {w!r}."
            )
        everything = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
        q = self.encode([a for a, _ in pairs], batch_size, max_query_length, **everything)
        p = self.encode([b for _, b in pairs], batch_size, max_passage_length, **everything)
        dense = (q["dense_vecs"] * p["dense_vecs"]).sum(1).tolist()
        sparse = [
            self.compute_lexical_matching_score(a, b)
            for a, b in zip(q["lexical_weights"], p["lexical_weights"], strict=True)
        ]
        colbert = [
            float(self.colbert_score(a, b))
            for a, b in zip(q["colbert_vecs"], p["colbert_vecs"], strict=True)
        ]
        scores = {
            "colbert": colbert,
            "sparse": sparse,
            "dense": dense,
            "sparse+dense": [
                (s * w[1] + d * w[0]) / (w[1] + w[0]) for s, d in zip(sparse, dense, strict=True)
            ],
            "colbert+sparse+dense": [
                (c * w[2] + s * w[1] + d * w[0]) / sum(w)
                for c, s, d in zip(colbert, sparse, dense, strict=True)
            ],
        }
        return {k: v[0] for k, v in scores.items()} if single else scores
