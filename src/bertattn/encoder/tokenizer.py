"""A thin wrapper over the ``tokenizers`` library for BERT WordPiece tokenization.

``tokenizer.json`` is used when present; otherwise ``vocab.txt`` plus ``do_lower_case`` (from
``tokenizer_config.json``) build the same pipeline as ``BertWordPieceTokenizer`` from
``tokenizers`` components. Truncation is never silent: it is reported with counts.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Encoding, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram, WordPiece
from torch import Tensor

from ..engine import TurnTaking
from ..errors import ModelFolderError
from .budget import TextBudget
from .jsonfile import ModelFolderNotFoundError, check_bool, check_real, read_json_object

logger = logging.getLogger("bertattn.encoder")

__all__ = ["BertTokenizer", "InvalidTextError", "TokenizedBatch", "read_tokenizer_config"]

_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidTextError(ValueError):
    """A text that is not valid Unicode: it holds a lone surrogate (U+D800..U+DFFF), which no
    UTF-8 encodes. ``field``: ``"texts"`` or ``"pairs"``; ``index``: the text's index;
    ``position``: the character's index in it; ``char``: the character."""

    def __init__(self, field: str, index: int, position: int, char: str) -> None:
        self.field, self.index, self.position, self.char = field, index, position, char
        super().__init__(
            f"{field}[{index}] holds a lone surrogate (U+{ord(char):04X}) at character "
            f"{position}: it is not valid Unicode (bytes decoded with errors='surrogateescape', "
            f"or half of a UTF-16 pair); decode the input with errors='replace' or fix it "
            f"where it was made."
        )


def check_unicode(texts: Sequence[str], field: str = "texts") -> None:
    """Raise :class:`InvalidTextError` for the first text holding a lone surrogate."""
    for i, text in enumerate(texts):
        found = _SURROGATE.search(text) if isinstance(text, str) else None
        if found is not None:
            raise InvalidTextError(field, i, found.start(), found.group())


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
        #: the truncation length is state of the wrapped tokenizer: one encode at a time, in
        #: the order the threads asked (a plain lock lets a thread that tokenizes without pause
        #: take it again at once, and another thread's encode waited behind it for its whole
        #: loop: Bert.encode beside a server's request threads)
        self._lock = TurnTaking()
        #: where a long text may be cut before tokenizing (bertattn.encoder.budget)
        self._budget = TextBudget(tokenizer)
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

    def join_pieces(self, pieces: Sequence[str]) -> str:
        """Vocabulary pieces as text, as the folder's decoder joins them (``##`` glued)."""
        return self._tok.decoder.decode(list(pieces))

    @property
    def marks_continuations(self) -> bool:
        """Whether a piece that continues a word says so itself (WordPiece's ``##``)."""
        return bool(getattr(self._tok.model, "continuing_subword_prefix", None))

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
        self._lock = TurnTaking()
        if "_budget" not in state:  # pickled before texts were cut
            self._budget = TextBudget(self._tok)

    # ------------------------------------------------------------------ encoding
    def _set_truncation(self, max_length: int | None) -> None:
        if self._truncation == max_length:
            return
        if max_length is None:
            self._tok.no_truncation()
        else:
            self._tok.enable_truncation(max_length, strategy="longest_first")
        self._truncation = max_length

    def _probe(self, prefixes: list[str]) -> list[Encoding]:
        """Prefixes tokenized whole, without special tokens (under the lock)."""
        self._set_truncation(None)
        return self._tok.encode_batch(prefixes, add_special_tokens=False)

    def _within_budget(self, texts: list[str], need: int) -> list[str]:
        """``texts`` cut where at least ``need`` of their first tokens are certain (under the
        lock): what lies beyond can never be kept (:mod:`bertattn.encoder.budget`)."""
        if all(self._budget.first_cut(t, need) is None for t in texts):
            return texts
        return self._budget.cut(texts, need, self._probe)

    def _keep_pair_order(
        self,
        texts: Sequence[str],
        pairs: Sequence[str],
        firsts: list[str],
        seconds: list[str],
        limit: int,
    ) -> None:
        """Where a pair was cut and both texts are long, cut again (in place) so that the cut
        pair has the same longer text as the whole pair: ``longest_first`` gives an odd room's
        extra token to the longer one (the second on a tie). Under the lock."""
        room = limit - self._tok.num_special_tokens_to_add(True)
        if room % 2 == 0:
            return  # an even room splits evenly: which one is longer does not matter
        for i, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
            cut_a, cut_b = len(a) < len(texts[i]), len(b) < len(pairs[i])
            if not (cut_a or cut_b):
                continue
            na, nb = (len(e.ids) for e in self._probe([a, b]))
            if not (cut_a and cut_b) and (nb < na if cut_a else na <= nb):
                continue  # the cut one is longer, whole as cut: the order is kept
            if self._budget.longer(texts[i], pairs[i], self._probe):
                if na <= nb:
                    firsts[i] = self._budget.cut([texts[i]], nb + 1, self._probe)[0]
            elif na > nb:
                seconds[i] = self._budget.cut([pairs[i]], na, self._probe)[0]

    def token_ids(self, texts: Sequence[str], *, most: int | None = None) -> list[list[int]]:
        """Each text's token ids without [CLS] / [SEP], never truncated (``most``: only the
        first ``most``, a long text cut before tokenizing what lies beyond). Texts that are
        not valid Unicode raise :class:`InvalidTextError`."""
        check_unicode(texts, "texts")
        with self._lock:
            cut = list(texts) if most is None else self._within_budget(list(texts), most + 1)
            self._set_truncation(None)
            done = self._tok.encode_batch(cut, add_special_tokens=False)
        return [e.ids if most is None else e.ids[:most] for e in done]

    def encode_windows(self, text: str, *, max_length: int, stride: int) -> list[Encoding]:
        """The whole of ``text`` as windows of ``max_length`` tokens ([CLS] and [SEP] in
        each), consecutive windows sharing ``stride`` tokens; offsets refer to ``text``."""
        check_unicode([text], "texts")
        with self._lock:
            self._tok.enable_truncation(max_length, stride=stride, strategy="longest_first")
            self._truncation = -1  # not a plain truncation: the next encode sets its own
            first = self._tok.encode(text)
        return [first, *first.overflowing]

    def count_tokens(self, text: str, *, most: int) -> int | None:
        """The tokens ``text`` gives ([CLS] and [SEP] included), or None when that is more
        than ``most``: the count costs about ``most`` tokens of work, whatever the text's
        length."""
        check_unicode([text])
        with self._lock:
            cut = self._within_budget([text], most + 1)[0]
            self._set_truncation(None)
            count = len(self._tok.encode(cut).ids)
        return None if len(cut) < len(text) or count > most else count

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
    ) -> list[Encoding]:
        """Raw encodings (truncated to ``max_length``, default the model's); reports how many
        were truncated through ``warnings`` and the ``bertattn.encoder`` logger. A long text is
        cut before tokenizing what can never be kept (:mod:`bertattn.encoder.budget`; the same
        tokens as the whole text's; a cut encoding's ``overflowing`` is only a flag). A text
        that is not valid Unicode (a lone surrogate) raises :class:`InvalidTextError` (a
        ``ValueError``) naming it and the position."""
        if isinstance(texts, str):
            raise ValueError("texts must be a sequence of strings; wrap a single text in a list.")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs; give one pair each.")
        limit = self.model_max_length if max_length is None else int(max_length)
        if limit < (5 if pairs is not None else 3):  # [CLS] a [SEP] (b [SEP]): a token each
            raise ValueError(
                f"max_length={limit} leaves no room for a token of each text after [CLS]/[SEP]."
            )
        check_unicode(texts, "texts")
        if pairs is not None:
            check_unicode(pairs, "pairs")
        with self._lock:
            firsts = self._within_budget(list(texts), limit + 1)
            if pairs is None:
                inputs: list = firsts
            else:
                seconds = self._within_budget(list(pairs), limit + 1)
                self._keep_pair_order(texts, pairs, firsts, seconds, limit)
                inputs = list(zip(firsts, seconds, strict=True))
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
        self._warn_unknown(encodings)
        return encodings

    @functools.cached_property
    def unk_token_id(self) -> int | None:
        """The id of the vocabulary's unknown token (``[UNK]``, ``<unk>``), None if it has none."""
        model = self._tok.model
        name = getattr(model, "unk_token", None)  # WordPiece, BPE: a token
        if name is not None:
            return self._tok.token_to_id(name)
        found = getattr(model, "unk_id", None)
        if found is None and isinstance(model, Unigram):
            # SentencePiece Unigram: an id, which tokenizers shows only in the model's state
            found = json.loads(model.__getstate__()).get("unk_id")
        return found if isinstance(found, int) else None

    def _warn_unknown(self, encodings: Sequence[Encoding]) -> None:
        """Warn when inputs are mostly the unknown token for this vocabulary (more than half of
        their tokens, specials aside): a script the model does not cover, such as Chinese for
        an English model. Their embeddings and attention then say little about the text."""
        unk = self.unk_token_id
        if unk is None:
            return
        mostly = 0
        for e in encodings:
            real = [
                t for t, special in zip(e.ids, e.special_tokens_mask, strict=True) if not special
            ]
            if real and 2 * sum(1 for t in real if t == unk) > len(real):
                mostly += 1
        if mostly:
            msg = (
                f"{mostly} of {len(encodings)} inputs are mostly unknown tokens for this model's "
                f"vocabulary (a script it does not cover, such as Chinese for an English model): "
                f"what it computes for them says little about the text; use a multilingual "
                f"model that covers it: run bertattn get-model multilingual-e5-small, then "
                f"load it by that name (--model multilingual-e5-small)"
            )
            logger.info("%s", msg)
            warnings.warn(msg, stacklevel=3)

    def pad(self, encodings: Sequence[Encoding]) -> TokenizedBatch:
        """Pad encodings to the longest one; ``attention_mask`` 1 = real token."""
        rows = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))  # (B,)
        longest = int(lengths.max(initial=0))
        b = len(encodings)
        ids = np.full((b, longest), self.pad_token_id, dtype=np.int64)
        types = np.zeros((b, longest), dtype=np.int64)
        for i, e in enumerate(encodings):  # numpy fills a row from a list without a tensor each
            n = int(lengths[i])
            ids[i, :n] = rows[i]
            types[i, :n] = e.type_ids
        mask = (np.arange(longest) < lengths[:, None]).astype(np.int64)  # (B, L)
        cut = sum(1 for e in encodings if e.overflowing)
        return TokenizedBatch(
            torch.from_numpy(ids),
            torch.from_numpy(mask),
            torch.from_numpy(types),
            [list(e.tokens) for e in encodings],
            cut,
        )

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
