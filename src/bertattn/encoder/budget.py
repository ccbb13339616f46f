"""Cut a long text before tokenizing what can never be used, without changing the result.

A BERT model takes at most ``max_length`` tokens; tokenizing a 10 MB text (1.7 M tokens) to keep
256 costs seconds and gigabytes. :class:`TextBudget` cuts such a text first, at a point where the
cut cannot change the tokens that are kept:

* it cuts only where the pipeline is understood: a WordPiece model, a ``BertNormalizer`` (or
  none) and a ``BertPreTokenizer`` (BERT); a byte-level BPE with GPT-2's pre-tokenizer regex
  (RoBERTa) or a SentencePiece Unigram split at spaces by ``Metaspace`` (XLM-RoBERTa), each
  with a normalizer that works character by character; so that every word is tokenized on its
  own. Another pipeline is tokenized whole, as before;
* it cuts only *before* a character that always ends a word: ASCII whitespace (space, tab,
  newline, carriage return), ASCII punctuation, or a CJK ideograph when the normalizer splits
  those (WordPiece); a space right after a non-space (byte-level BPE and SentencePiece, whose
  pieces carry the space before them: no run of spaces is split). The words before the cut
  are then whole;
* the cut is verified, not assumed: the prefix is tokenized, and it is kept only if at least
  ``need`` of its tokens end ``guard`` characters before the cut (``guard``: longer than any
  added token, the only unit that can cross the cut, and whose absence can change the word
  before it). Those tokens are the full text's first tokens, the same ids and offsets. A
  prefix with too few (runs of whitespace, words that vanish under normalization) is doubled
  and tried again; where no cut point follows, the whole text is tokenized.

With ``need`` = the truncation length + 1, a text cut this way truncates to exactly what the
whole text truncates to, and is flagged as truncated as the whole text is (its ``overflowing``
then holds the cut prefix's rest, not the whole rest: read it as a flag).

Text pairs: ``longest_first`` truncation splits an odd room between two long texts giving the
extra token to the longer one (the second on a tie), so when both are long the cut must keep
which one is longer. :meth:`TextBudget.longer` counts both, chunk by chunk (cut at whitespace,
which changes no token), until the shorter one ends: memory stays bounded, time grows with the
shorter text. Only a pair of two long texts pays it.
"""

from __future__ import annotations

import json
import logging
import re
import string
from collections.abc import Callable, Iterator, Sequence

from tokenizers import Encoding, Tokenizer

logger = logging.getLogger("bertattn.encoder")

__all__ = ["TextBudget"]

#: characters per chunk when counting a whole text's tokens (:meth:`TextBudget.longer`)
COUNT_CHUNK = 1 << 16

#: characters per token the first cut allows (English is ~4-6 with spaces); a text up to this
#: many characters per needed token is never cut, nor probed
CHARS_PER_TOKEN = 16

_ASCII_WORD_ENDS = " \t\n\r" + string.punctuation
#: the CJK ideograph blocks BERT's normalizer puts spaces around (``handle_chinese_chars``)
_CJK_RANGES = (
    "\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff"
    "\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b820-\U0002ceaf\U0002f800-\U0002fa1f"
)


#: a cut point for byte-level BPE and SentencePiece: a space right after a non-space. The word
#: before it ends there (GPT-2's pre-tokenizer regex starts a new piece at a space; Metaspace
#: splits at it), and no whitespace run is split (its pieces would depend on its length)
_SPACE_AFTER_WORD = r"(?<=\S) "

#: normalizers that work character by character (or on runs of spaces only): a cut before a
#: space changes nothing before it
_LOCAL_NORMALIZERS = {
    "NFC", "NFD", "NFKC", "NFKD", "Nmt", "Lowercase", "Precompiled", "StripAccents", "Strip",
    "Prepend",
}  # fmt: skip


def _local_normalizer(spec: dict | None) -> bool:
    """Whether the normalizer ``spec`` (tokenizer.json's) cannot change text before a cut
    that lies before a space: character-wise ones, and ``Replace`` of runs of spaces."""
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_local_normalizer(n) for n in spec.get("normalizers") or [])
    if kind == "Replace":
        pattern = spec.get("pattern") or {}
        text = pattern.get("Regex", pattern.get("String"))
        return isinstance(text, str) and re.fullmatch(r"[ {},0-9+*]+", text) is not None
    return kind in _LOCAL_NORMALIZERS


def _splits_at_spaces(spec: dict) -> bool:
    """A byte-level BPE (GPT-2's regex pre-tokenizer: RoBERTa) or a SentencePiece Unigram
    (Metaspace splitting at spaces: XLM-RoBERTa) pipeline with a local normalizer: each word is
    tokenized on its own, and a space after a word ends it."""
    model = (spec.get("model") or {}).get("type")
    pre = spec.get("pre_tokenizer") or {}
    if not _local_normalizer(spec.get("normalizer")):
        return False
    if model == "BPE":
        return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
    if model == "Unigram":
        return pre.get("type") == "Metaspace" and pre.get("split", True) is True
    return False


class TextBudget:
    """Where a text may be cut for a tokenizer (see the module docstring).

    Args:
        tokenizer: the ``tokenizers.Tokenizer`` whose pipeline decides whether and where.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        spec = json.loads(tokenizer.to_str())
        normalizer = spec.get("normalizer") or {"type": "BertNormalizer", "clean_text": False}
        wordpiece = (
            (spec.get("model") or {}).get("type") == "WordPiece"
            and normalizer.get("type") == "BertNormalizer"
            and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
        )
        #: byte-level BPE (RoBERTa) or SentencePiece Unigram (XLM-RoBERTa): cut before a space
        spaces = not wordpiece and _splits_at_spaces(spec)
        self.supported = wordpiece or spaces
        ends = re.escape(_ASCII_WORD_ENDS)
        if normalizer.get("handle_chinese_chars"):
            ends += _CJK_RANGES
        self._word_end = re.compile(_SPACE_AFTER_WORD if spaces else f"[{ends}]")
        contents = [t.get("content", "") for t in spec.get("added_tokens") or []]
        added = [len(c) for c in contents]
        #: chunk ends for counting: ASCII whitespace (a space after a word for byte-level BPE
        #: and SentencePiece, whose tokens carry their space), where no added token holds any
        self._chunk_end = (
            None
            if any(ch in c for c in contents for ch in " \t\n\r")
            else (_SPACE_AFTER_WORD if spaces else "[ \t\n\r]")
        )
        #: characters before a cut whose tokens are not trusted: an added token crossing the
        #: cut (at most this long, raw or normalized) can change the word before it
        self.guard = 4 * max(added, default=0) + 16
        if not self.supported:
            logger.debug(
                "texts are not cut before tokenizing: the tokenizer is not WordPiece, byte-level "
                "BPE or SentencePiece Unigram with a pipeline that tokenizes each word alone"
            )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_word_end"] = self._word_end.pattern
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._word_end = re.compile(state["_word_end"])
        self.__dict__.setdefault("_chunk_end", None)

    def first_cut(self, text: str, need: int) -> int | None:
        """The first point to try: the first word end at or after ``need`` x
        :data:`CHARS_PER_TOKEN` characters; None when the text is shorter or has no word end
        there (it is tokenized whole)."""
        return self._cut_at(text, need * CHARS_PER_TOKEN)

    def _cut_at(self, text: str, start: int) -> int | None:
        if not self.supported or not isinstance(text, str) or len(text) <= start:
            return None
        found = self._word_end.search(text, start)
        return None if found is None else found.start()

    def enough(self, encoding: Encoding, cut: int, need: int) -> bool:
        """Whether ``encoding`` (of ``text[:cut]``, no special tokens, not truncated) holds at
        least ``need`` tokens that the cut cannot have changed."""
        limit = cut - self.guard
        trusted = 0
        for _start, stop in encoding.offsets:
            if stop > limit:
                break
            trusted += 1
        return trusted >= need

    def cut(
        self,
        texts: Sequence[str],
        need: int,
        probe: Callable[[list[str]], list[Encoding]],
    ) -> list[str]:
        """``texts``, each cut where at least ``need`` of its first tokens are certain.
        ``probe(prefixes)`` tokenizes without truncation and without special tokens."""
        out = list(texts)
        pending = {i: c for i, t in enumerate(out) if (c := self.first_cut(t, need)) is not None}
        while pending:
            order = sorted(pending)
            encodings = probe([texts[i][: pending[i]] for i in order])
            retry = {}
            for i, enc in zip(order, encodings, strict=True):
                cut = pending[i]
                if self.enough(enc, cut, need):
                    out[i] = texts[i][:cut]
                    logger.debug("text %d cut at %d of %d characters", i, cut, len(texts[i]))
                elif (again := self._cut_at(texts[i], 2 * cut)) is not None:
                    retry[i] = again
            pending = retry
        return out

    def _chunk_counts(
        self, text: str, probe: Callable[[list[str]], list[Encoding]]
    ) -> Iterator[int]:
        """The tokens of ``text``, chunk by chunk (each cut before ASCII whitespace, which
        ends every word and is no token: the counts add up to the whole text's)."""
        ends = None if self._chunk_end is None else re.compile(self._chunk_end)
        pos = 0
        while pos < len(text):
            found = None if ends is None else ends.search(text, pos + COUNT_CHUNK)
            end = len(text) if found is None else found.start()
            yield len(probe([text[pos:end]])[0].ids)
            pos = end

    def longer(self, first: str, second: str, probe: Callable[[list[str]], list[Encoding]]) -> bool:
        """Whether ``first`` gives more tokens than ``second``, counting both a chunk at a
        time until the shorter one ends."""
        counts = [self._chunk_counts(first, probe), self._chunk_counts(second, probe)]
        totals, done = [0, 0], [False, False]
        while True:
            if done[0] and done[1]:
                return totals[0] > totals[1]
            if done[0] and totals[1] > totals[0]:
                return False
            if done[1] and totals[0] > totals[1]:
                return True
            k = 0 if not done[0] and (done[1] or totals[0] <= totals[1]) else 1
            step = next(counts[k], None)
            if step is None:
                done[k] = True
            else:
                totals[k] += step
