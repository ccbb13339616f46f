"""``Bert``: a model and its tokenizer. Sentence embeddings and attention maps from texts.

Reads sentence-transformers settings when the folder has them (``modules.json``, the pooling
config, ``sentence_bert_config.json``), so ``Bert.load(folder).encode(texts)`` gives what
``SentenceTransformer(folder).encode(texts)`` gives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..attention.steps import record_steps
from ..errors import ModelFolderError
from ..maps import AttentionMaps
from .folder import POOLINGS, ModelFolder, default_model_dir, resolve_model
from .model import BertModel
from .steps import AttentionSteps, attention_steps
from .tokenizer import BertTokenizer

logger = logging.getLogger("bertattn.bert")

__all__ = [
    "Bert",
    "EncodeStats",
    "POOLINGS",
    "default_model_dir",  # re-exported from .folder for old callers
    "read_sentence_settings",
]


@dataclass
class SentenceSettings:
    """What a sentence-transformers folder says about pooling and length (kept for old
    callers; :class:`ModelFolder` has the same fields)."""

    model_dir: Path
    pooling: str = "cls"
    normalize: bool = False
    max_length: int | None = None


def read_sentence_settings(folder: str | Path | None) -> SentenceSettings:
    """Deprecated: the pooling / normalize / max length of :func:`resolve_model` ``(folder)``;
    call :func:`bertattn.bert.folder.resolve_model` instead."""
    resolved = resolve_model(folder)
    return SentenceSettings(
        resolved.model_dir, resolved.pooling, resolved.normalize, resolved.max_length
    )


@dataclass
class EncodeStats:
    """What one :meth:`Bert.encode` call did. ``tokens``: real tokens; ``padded``: tokens in
    the padded batches (real + padding), so ``1 - tokens / padded`` is the padding ratio."""

    texts: int = 0
    empty: int = 0
    truncated: int = 0
    tokens: int = 0
    padded: int = 0


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """``(B, L, E)`` -> ``(B, E)``: mean over real tokens, or the [CLS] vector."""
    if pooling == "cls":
        return hidden[:, 0]
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (B, E)


def length_batches(
    lengths: Sequence[int], batch_size: int, batch_tokens: int | None = None
) -> list[tuple[int, int]]:
    """``(start, end)`` ranges over texts sorted longest first: at most ``batch_size`` texts,
    and, when ``batch_tokens`` is set, at most that many tokens after padding (the first text
    of a range is its longest, so a range of n texts pads to ``n * lengths[start]``)."""
    out, start = [], 0
    while start < len(lengths):
        end = start + 1
        while (
            end < len(lengths)
            and end - start < batch_size
            and (batch_tokens is None or (end + 1 - start) * max(lengths[start], 1) <= batch_tokens)
        ):
            end += 1
        out.append((start, end))
        start = end
    return out


class Bert:
    """A BERT model with its tokenizer and sentence settings.

    Attributes:
        model, tokenizer; pooling (``"mean"`` / ``"cls"``), normalize, max_length (tokens), name;
        folder: the :class:`ModelFolder` it was loaded from (None when built directly).
    """

    def __init__(
        self,
        model: BertModel,
        tokenizer: BertTokenizer,
        *,
        pooling: str = "cls",
        normalize: bool = False,
        max_length: int | None = None,
        name: str = "",
        folder: ModelFolder | None = None,
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not supported; use one of {POOLINGS}.")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = bool(normalize)
        limit = model.config.max_position_embeddings
        self.max_length = min(max_length or tokenizer.model_max_length, limit)
        self.name = name
        self.folder = folder

    @classmethod
    def load(
        cls,
        path: str | Path | ModelFolder | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        backend: str = "auto",
    ) -> Bert:
        """Load a model folder (default: all-MiniLM-L6-v2), a cached hub name, or a resolved
        :class:`ModelFolder` (see :func:`bertattn.bert.folder.resolve_model`); the tokenizer
        is checked against the config before the weights are read."""
        folder = resolve_model(path)
        tokenizer = folder.load_tokenizer()
        model = BertModel.from_pretrained(folder, dtype=dtype, backend=backend)
        return cls(
            model,
            tokenizer,
            pooling=folder.pooling,
            normalize=folder.normalize,
            max_length=folder.max_length,
            name=folder.name,
            folder=folder,
        )

    # ------------------------------------------------------------------ embeddings
    def encode(
        self,
        texts: Sequence[str],
        pooling: str | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        *,
        progress: Callable[[int], object] | None = None,
        batch_tokens: int | None = None,
    ) -> np.ndarray:
        """Sentence embeddings, ``(N, E)`` float32, in input order.

        Texts are sorted by token count and batched, so each batch pads little.
        ``progress(n)`` is called after each batch with the number of texts it held.
        """
        return self.encode_with_stats(
            texts,
            pooling,
            normalize,
            batch_size,
            max_length,
            progress=progress,
            batch_tokens=batch_tokens,
        )[0]

    def encode_with_stats(
        self,
        texts: Sequence[str],
        pooling: str | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        *,
        progress: Callable[[int], object] | None = None,
        batch_tokens: int | None = None,
    ) -> tuple[np.ndarray, EncodeStats]:
        """:meth:`encode`, plus counts (texts, empty, truncated, tokens)."""
        pooling = self.pooling if pooling is None else pooling
        normalize = self.normalize if normalize is None else bool(normalize)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not supported; use one of {POOLINGS}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings; wrap a single text in a list.")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"texts[{bad}] is a {type(texts[bad]).__name__}, not a str.")
        limit = self.max_length if max_length is None else int(max_length)
        if limit > self.model.config.max_position_embeddings:
            raise ValueError(
                f"max_length={limit} exceeds the model's max_position_embeddings "
                f"({self.model.config.max_position_embeddings})."
            )
        width = self.model.config.hidden_size
        out = np.zeros((len(texts), width), dtype=np.float32)
        stats = EncodeStats(texts=len(texts), empty=sum(1 for t in texts if not t.strip()))
        if not texts:
            return out, stats
        encodings = self.tokenizer.encode_batch(texts, max_length=limit)
        stats.truncated = sum(1 for e in encodings if e.overflowing)
        stats.tokens = sum(len(e.ids) for e in encodings)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))  # longest first
        device = self.model.device
        with torch.inference_mode():
            lengths = [len(encodings[i].ids) for i in order]
            for start, end in length_batches(lengths, batch_size, batch_tokens):
                idx = order[start:end]
                batch = self.tokenizer.pad([encodings[i] for i in idx])
                stats.padded += batch.input_ids.numel()
                mask = batch.attention_mask.to(device)
                result = self.model(
                    batch.input_ids.to(device), mask, batch.token_type_ids.to(device)
                )
                emb = pool(result.last_hidden_state, mask, pooling).float()  # (B, E)
                if normalize:
                    emb = torch.nn.functional.normalize(emb, p=2, dim=1)
                out[idx] = emb.cpu().numpy()
                if progress is not None:
                    progress(len(idx))
        return out, stats

    # ------------------------------------------------------------------ attention
    def attention_maps(
        self,
        text: str,
        pair: str | None = None,
        layers: Sequence[int] | None = None,
        *,
        max_length: int | None = None,
        qkv_layers: Sequence[int] = (),
    ) -> AttentionMaps:
        """Attention weights of one text (or text pair) as :class:`bertattn.AttentionMaps`.

        ``layers``: the layer indices to return (None = all); only those layers compute
        weights, the others run the fused backend. ``max_length``: tokens kept (default the
        model folder's setting; at most ``max_position_embeddings``). ``qkv_layers``: layers
        (among those returned) whose q / k / v projections go into ``maps.qkv``, for the page's
        step view.
        """
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
            raise ValueError("text (and pair) must be strings.")
        limit = self.max_length if max_length is None else max_length
        top_limit = self.model.config.max_position_embeddings
        if isinstance(limit, bool) or not isinstance(limit, int) or not 2 <= limit <= top_limit:
            raise ValueError(
                f"max_length {limit!r} is out of range: this model takes 2..{top_limit} tokens."
            )
        batch = self.tokenizer([text], None if pair is None else [pair], max_length=limit)
        want = True if layers is None else list(layers)
        returned = range(self.model.config.num_hidden_layers) if layers is None else list(layers)
        bad = [i for i in qkv_layers if i not in returned]
        if bad:
            raise ValueError(f"qkv_layers {bad} are not among the layers returned.")
        if not want:
            raise ValueError("layers is empty; pass None for every layer or some layer indices.")
        top = int(batch.token_type_ids.max())
        if top >= self.model.config.type_vocab_size:  # a pair on a model with one token type
            config = "config.json" if self.folder is None else self.folder.config_path
            source = getattr(self.tokenizer, "source", None) or "the tokenizer"
            raise ModelFolderError(
                f"{config}: type_vocab_size={self.model.config.type_vocab_size}, but {source} "
                f"gives the second text of a pair token type {top}: this model takes no text "
                f"pairs. Call attention_maps without pair=, or use a model with "
                f"type_vocab_size >= {top + 1}."
            )
        device = self.model.device
        with torch.inference_mode(), record_steps() if qkv_layers else nullcontext() as rec:
            result = self.model(
                batch.input_ids.to(device),
                batch.attention_mask.to(device),
                batch.token_type_ids.to(device),
                output_attentions=want,
            )
        qkv = {}
        if rec is not None:  # one math call per returned layer, in layer order
            for i, r in zip(sorted(returned), rec.records, strict=True):
                if i in qkv_layers:
                    qkv[i] = {"q": r.q[0], "k": r.k[0], "v": r.v[0]}  # (H, L, D) each
        segment_start = None
        if pair is not None:
            types = batch.token_type_ids[0].tolist()
            segment_start = types.index(1) if 1 in types else None
        maps = AttentionMaps.from_model_output(
            batch.tokens[0],
            result.attentions or (),
            segment_start=segment_start,
            model_name=self.name,
        )
        if qkv:
            maps.qkv = {
                i: {k: t.float().numpy(force=True) for k, t in d.items()} for i, d in qkv.items()
            }
            maps.validate()
        return maps

    def attention_steps(
        self,
        text: str,
        *,
        layer: int,
        head: int,
        query: int | str,
        pair: str | None = None,
        max_length: int | None = None,
    ) -> AttentionSteps:
        """The article's steps for one head and one query token (index or token text), from
        the ``math`` backend's own intermediate values: see :class:`AttentionSteps`."""
        return attention_steps(
            self, text, layer=layer, head=head, query=query, pair=pair, max_length=max_length
        )
