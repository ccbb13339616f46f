"""A thin wrapper over the ``tokenizers`` library for BERT WordPiece tokenization.

``tokenizer.json`` is used when present; otherwise ``vocab.txt`` plus ``do_lower_case`` (from
``tokenizer_config.json``) build the same pipeline as ``BertWordPieceTokenizer`` from
``tokenizers`` components. Truncation is never silent: it is reported with counts.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from torch import Tensor

from ..errors import ModelFolderError
from .jsonfile import ModelFolderNotFoundError, check_bool, check_real, read_json_object

logger = logging.getLogger("bertattn.bert")

__all__ = ["BertTokenizer", "TokenizedBatch", "read_tokenizer_config"]


def read_tokenizer_config(path: Path) -> dict:
    """``tokenizer_config.json``, with the fields bertattn reads checked (type and range)."""
    cfg = read_json_object(path)
    try:
        if cfg.get("model_max_length") is not None:
            check_real(
                "model_max_length",
                cfg["model_max_length"],
                low=1.0,
                high=None,
                hint="write the longest input in tokens, such as 512",
            )
        for name in ("do_lower_case", "tokenize_chinese_chars"):
            if name in cfg:
                check_bool(name, cfg[name])
        if "strip_accents" in cfg:
            check_bool("strip_accents", cfg["strip_accents"], null=True)
        pad = cfg.get("pad_token")
        content = pad.get("content") if isinstance(pad, dict) else pad
        if pad is not None and not isinstance(content, str):
            raise ValueError(
                f'pad_token must be a string such as "[PAD]" (or an object with a string '
                f'"content"), got {pad!r}.'
            )
    except ValueError as exc:
        raise ModelFolderError(f"{path}: {exc}") from None
    return cfg


@dataclass
class TokenizedBatch:
    """A padded batch: ``input_ids``, ``attention_mask``, ``token_type_ids`` all ``(B, L)``
    int64; ``tokens`` the token strings of each text (no padding); ``num_truncated`` how many
    texts (or pairs) were cut to ``max_length``."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    tokens: list[list[str]]
    num_truncated: int = 0


class BertTokenizer:
    """Tokenize texts (or text pairs) for a BERT model.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` whose post-processor adds [CLS]/[SEP].
        model_max_length: the longest sequence the model takes (tokens, specials included).
        pad_token: the padding token.
    """

    def __init__(
        self, tokenizer: Tokenizer, *, model_max_length: int = 512, pad_token: str = "[PAD]"
    ) -> None:
        self._tok = tokenizer
        self._tok.no_padding()
        self._tok.no_truncation()
        self._truncation: int | None = None
        #: the truncation length is state of the wrapped tokenizer: one encode at a time
        self._lock = threading.Lock()
        self.model_max_length = int(model_max_length)
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise ValueError(f"the vocabulary has no padding token {pad_token!r}.")
        self.pad_token_id = pad_id
        self.source: Path | None = None  # the file it was read from (from_folder)

    @classmethod
    def from_folder(
        cls, folder: str | Path, *, model_max_length: int | None = None
    ) -> BertTokenizer:
        """``tokenizer.json`` if present, else ``vocab.txt`` (+ ``tokenizer_config.json``).
        A malformed file raises :class:`~bertattn.errors.ModelFolderError` naming it."""
        folder = Path(folder)
        cfg_path = folder / "tokenizer_config.json"
        cfg = read_tokenizer_config(cfg_path) if cfg_path.is_file() else {}
        if model_max_length is None:
            limit = cfg.get("model_max_length") or 512
            model_max_length = int(min(limit, 10**6))  # HF's "no limit" is 1e30
        pad = cfg.get("pad_token") or "[PAD]"
        pad = pad.get("content", "[PAD]") if isinstance(pad, dict) else pad
        if (folder / "tokenizer.json").is_file():
            source = folder / "tokenizer.json"
            try:
                tok = Tokenizer.from_file(str(source))
            except Exception as exc:
                raise ModelFolderError(
                    f"cannot read {source}: {exc}; download it again, or delete it to use "
                    f"vocab.txt."
                ) from None
        elif (folder / "vocab.txt").is_file():
            source = folder / "vocab.txt"
            tok = wordpiece_from_vocab(
                source,
                lowercase=cfg.get("do_lower_case", True),
                strip_accents=cfg.get("strip_accents"),
                handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
            )
        else:
            raise ModelFolderNotFoundError(f"{folder}: no tokenizer.json and no vocab.txt.")
        try:
            out = cls(tok, model_max_length=model_max_length, pad_token=pad)
        except ValueError as exc:
            raise ModelFolderError(f"{source}: {exc}") from None
        out.source = source
        return out

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary, added tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def max_token_id(self) -> int:
        """The largest id the tokenizer can produce (added tokens included); -1 if none."""
        return max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1)

    def max_type_id(self, *, pair: bool = False) -> int:
        """The largest token type the post-processor gives a single text (or a text pair)."""
        enc = self._tok.encode("a", "b") if pair else self._tok.encode("a")
        return max(enc.type_ids, default=0)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` (``"[UNK]"``-free: an unknown id raises
        ``ValueError``)."""
        token = self._tok.id_to_token(int(token_id))
        if token is None:
            raise ValueError(f"token id {token_id} is not in the vocabulary of {self.vocab_size}.")
        return token

    def token_to_id(self, token: str) -> int | None:
        """The id of vocabulary entry ``token`` (None when it is not one)."""
        return self._tok.token_to_id(token)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of token ids, as the folder's decoder joins them (WordPiece: ``##`` pieces
        glued, spaces before punctuation cleaned)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]  # a lock does not pickle or copy; each copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ encoding
    def _set_truncation(self, max_length: int) -> None:
        if self._truncation != max_length:
            self._tok.enable_truncation(max_length, strategy="longest_first")
            self._truncation = max_length

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
    ) -> list[Encoding]:
        """Raw encodings (truncated to ``max_length``, default the model's); reports how many
        were truncated through ``warnings`` and the ``bertattn.bert`` logger."""
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings; wrap a single text in a list.")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs; give one pair each.")
        limit = self.model_max_length if max_length is None else int(max_length)
        if limit < (5 if pairs is not None else 3):  # [CLS] a [SEP] (b [SEP]): a token each
            raise ValueError(
                f"max_length={limit} leaves no room for a token of each text after [CLS]/[SEP]."
            )
        inputs = list(texts) if pairs is None else list(zip(texts, pairs, strict=True))
        with self._lock:
            self._set_truncation(limit)
            encodings = self._tok.encode_batch(inputs)
        cut = sum(1 for e in encodings if e.overflowing)
        if cut:
            msg = (
                f"{cut} of {len(encodings)} inputs were longer than max_length={limit} tokens "
                f"and were truncated"
            )
            logger.info("%s", msg)
            warnings.warn(msg, stacklevel=3)
        return encodings

    def pad(self, encodings: Sequence[Encoding]) -> TokenizedBatch:
        """Pad encodings to the longest one; ``attention_mask`` 1 = real token."""
        longest = max((len(e.ids) for e in encodings), default=0)
        b = len(encodings)
        ids = torch.full((b, longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((b, longest), dtype=torch.long)
        types = torch.zeros((b, longest), dtype=torch.long)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n] = torch.tensor(e.ids, dtype=torch.long)
            mask[i, :n] = 1
            types[i, :n] = torch.tensor(e.type_ids, dtype=torch.long)
        cut = sum(1 for e in encodings if e.overflowing)
        return TokenizedBatch(ids, mask, types, [list(e.tokens) for e in encodings], cut)

    def __call__(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
    ) -> TokenizedBatch:
        """Tokenize and pad a batch of texts (or of text pairs: ``token_type_ids`` 1 on the
        second segment)."""
        return self.pad(self.encode_batch(texts, pairs, max_length=max_length))


def wordpiece_from_vocab(
    vocab_file: Path,
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
) -> Tokenizer:
    """The ``BertWordPieceTokenizer`` pipeline, from ``tokenizers`` components."""
    try:
        vocab = WordPiece.read_file(str(vocab_file))
    except Exception as exc:  # the tokenizers library raises plain Exception
        raise ModelFolderError(
            f"cannot read {vocab_file}: {exc}; it must be UTF-8 text, one token per line."
        ) from None
    for special in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"):
        if special not in vocab:
            raise ModelFolderError(f"{vocab_file}: the vocabulary has no {special} token.")
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=handle_chinese_chars,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    special = [t for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]") if t in vocab]
    tok.add_special_tokens(special)
    return tok
