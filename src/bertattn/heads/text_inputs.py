"""Texts and text pairs of the heads (``CrossEncoder``, ``SparseEncoder``), tokenized as
sentence-transformers' ``Transformer`` module tokenizes them: a text as ``[CLS] a [SEP]``, a pair
as ``[CLS] a [SEP] b [SEP]`` (the tokenizer's own pair template), cut longest-first to the
token limit; and the per-call limit sentence-transformers' ``processing_kwargs=`` asks for."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from tokenizers import Encoding, Tokenizer

from ..arguments import check_int
from ..encoder import Bert
from ..encoder.st_compat import UnsupportedArgumentError, processing_max_length

__all__ = ["call_max_length", "encode_inputs", "pair_minimum"]

#: the shortest limit bertattn's tokenizer takes for a pair: [CLS] a [SEP] b [SEP]
_PAIR_FLOOR = 5


def call_max_length(bert: Bert, processing_kwargs: object) -> int:
    """The token limit of one call: ``processing_kwargs={"text": {"max_length": N}}``
    (sentence-transformers' per-call tokenizer settings; ``truncation=True`` /
    ``"longest_first"`` and ``padding=True`` / ``"longest"`` change nothing and are taken, any
    other key is refused by name) within ``3..max_position_embeddings``, else the model's
    ``max_seq_length``."""
    try:
        asked = processing_max_length(processing_kwargs, None)
    except UnsupportedArgumentError as e:  # the heads have no max_length= keyword to point at
        raise UnsupportedArgumentError(str(e).replace(", or max_length=N", "")) from None
    if asked is None:
        return bert.max_length
    top = bert.model.config.max_position_embeddings
    return check_int(  # type: ignore[return-value]
        asked,
        "processing_kwargs['text']['max_length']",
        low=3,
        high=top,
        why=f"[CLS], [SEP] and a token of the text; the model's max_position_embeddings is {top}",
    )


def pair_minimum(bert: Bert) -> int:
    """The fewest tokens a pair may be cut to and keep a token of each text: the special tokens
    the model's tokenizer adds to a pair (3 for BERT's ``[CLS] a [SEP] b [SEP]``, 4 for
    RoBERTa's ``<s> a </s></s> b </s>``) plus two."""
    return int(bert.tokenizer._tok.num_special_tokens_to_add(True)) + 2


def encode_inputs(
    bert: Bert, firsts: Sequence[str], seconds: Sequence[str | None], max_length: int
) -> list[Encoding]:
    """The encodings of the inputs in order: ``firsts[i]`` alone where ``seconds[i]`` is None,
    else the pair ``(firsts[i], seconds[i])``, each cut to ``max_length`` tokens."""
    tok = bert.tokenizer
    encodings: list[Any] = [None] * len(firsts)
    singles = [i for i, s in enumerate(seconds) if s is None]
    pairs = [i for i, s in enumerate(seconds) if s is not None]
    for group, second in ((singles, None), (pairs, [seconds[i] for i in pairs])):
        if not group:
            continue
        texts = [firsts[i] for i in group]
        if second is not None and max_length < _PAIR_FLOOR:
            done = _short_pairs(bert, texts, second, max_length)  # type: ignore[arg-type]
        else:
            done = tok.encode_batch(texts, second, max_length=max_length)  # type: ignore[arg-type]
        for i, enc in zip(group, done, strict=True):
            encodings[i] = enc
    return encodings


def _short_pairs(bert: Bert, texts: list[str], pairs: list[str], max_length: int) -> list[Encoding]:
    """Pairs cut to 3 or 4 tokens (one text or both lose every token, as transformers' tokenizer
    cuts them: ``[CLS] [SEP] b1 [SEP]`` at 4), which bertattn's tokenizer refuses: on a copy of
    its ``tokenizers.Tokenizer`` made for the call (the wrapped one keeps its own truncation
    setting, shared by threads)."""
    copy = Tokenizer.from_str(bert.tokenizer._tok.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length, strategy="longest_first")
    encodings = copy.encode_batch(list(zip(texts, pairs, strict=True)))
    cut = sum(1 for e in encodings if e.overflowing)
    if cut:  # as bertattn's tokenizer reports a cut
        warnings.warn(
            f"{cut} of {len(encodings)} inputs were longer than max_length={max_length} tokens "
            f"and were truncated",
            stacklevel=4,
        )
    return encodings
