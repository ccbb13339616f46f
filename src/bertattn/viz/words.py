"""The words the steps are taught with, shared by the page (``attention.js``) and the terminal
(``bertattn attend --explain``), and the terminal's display-width padding.

:data:`ARTICLE_CODE` holds the article's own PyTorch lines for each of its nine steps, as its
``MultiHeadAttention.forward`` writes them (the page embeds them in its data and shows them
labelled "article (PyTorch)"; the terminal prints them under the formula's lines).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping, Sequence

__all__ = [
    "ARTICLE_CODE",
    "LANGS",
    "STEP_NAMES",
    "check_lang",
    "clip",
    "display_width",
    "lang_from_env",
    "ljust",
    "rjust",
    "subword_note",
]

#: the article's steps, in its order
STEP_NAMES: tuple[str, ...] = (
    "qkv",
    "split",
    "scores",
    "scaled",
    "mask",
    "softmax",
    "dropout",
    "context",
    "merge",
)

#: step name -> the article's line(s) for it, verbatim (③ and ④ are one line in the article)
ARTICLE_CODE: dict[str, tuple[str, ...]] = {
    "qkv": (
        "q = self.q_linear(x)",
        "k = self.k_linear(x)",
        "v = self.v_linear(x)",
    ),
    "split": (
        "q = q.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "k = k.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "v = v.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
    ),
    "scores": ("scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)",),
    "scaled": ("scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)",),
    "mask": (
        "if mask is not None:",
        "    scores = scores.masked_fill(mask == 0, -1e9)",
    ),
    "softmax": ("attention = torch.softmax(scores, dim=-1)",),
    "dropout": ("attention = self.dropout(attention)",),
    "context": ("context = torch.matmul(attention, v)",),
    "merge": (
        "context = context.transpose(1, 2).contiguous().view(batch_size, -1, self.embed_dim)",
        "output = self.out_linear(context)",
    ),
}

#: the languages the steps are told in
LANGS = ("en", "zh")


def check_lang(lang: object) -> str:
    """``lang`` if it is one of :data:`LANGS`, else ``ValueError`` naming them."""
    if lang not in LANGS:
        raise ValueError(f"lang must be 'en' or 'zh', got {lang!r}; give lang='en' or lang='zh'.")
    return str(lang)


def lang_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``"zh"`` when the locale (``LC_ALL``, else ``LC_MESSAGES``, else ``LANG``: the first one
    set) starts with ``zh``, else ``"en"``."""
    env = os.environ if environ is None else environ
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = env.get(name, "")
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def char_width(c: str) -> int:
    """Terminal columns of one character: 2 for East Asian wide / fullwidth, 0 for combining
    marks and zero-width characters, 1 otherwise."""
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns of ``text`` (CJK characters count 2: :func:`char_width`)."""
    return sum(char_width(c) for c in text)


def clip(text: str, width: int) -> str:
    """The longest start of ``text`` that takes at most ``width`` columns."""
    used = 0
    for n, c in enumerate(text):
        used += char_width(c)
        if used > width:
            return text[:n]
    return text


def ljust(text: str, width: int, *, clip_at: int | None = None) -> str:
    """``text`` (cut to ``clip_at`` columns first, if given) padded on the right to ``width``
    columns of display width."""
    if clip_at is not None:
        text = clip(text, clip_at)
    return text + " " * max(0, width - display_width(text))


def rjust(text: str, width: int) -> str:
    """``text`` padded on the left to ``width`` columns of display width."""
    return " " * max(0, width - display_width(text)) + text


#: the subword marks of the tokenizers bertattn loads, by where they stand
_MARKS = {
    "en": {
        "##": "“##” marks a piece that continues the word before it (WordPiece): {a} {b} are "
        "one word, {word}.",
        "▁": "“▁” marks a token that starts a word (the space before it; SentencePiece); a "
        "token without it continues the word before it, and “▁” alone is a word start whose "
        "letters come as the next token.",
        "Ġ": "“Ġ” marks a token that starts a word (the space before it; byte-level BPE); a "
        "token without it continues the word before it.",
    },
    "zh": {
        "##": "“##” 表示接在前一个词元后面的词片（WordPiece）：{a} {b} 是同一个词 {word}。",
        "▁": "“▁” 表示词的开头（前面有空格；SentencePiece）；没有它的词元接在前一个词元后面，"
        "单独的 “▁” 是一个词的开头，字母在下一个词元里。",
        "Ġ": "“Ġ” 表示词的开头（前面有空格；字节级 BPE）；没有它的词元接在前一个词元后面。",
    },
}


def subword_note(tokens: Sequence[str], lang: str = "en") -> str:
    """One line explaining the subword mark the tokens carry (``##``, ``▁`` or ``Ġ``), with
    an example from the tokens for ``##``; "" when they carry none."""
    marks = _MARKS[check_lang(lang)]
    for j, tok in enumerate(tokens):
        if tok.startswith("##") and len(tok) > 2 and j > 0:
            a = tokens[j - 1]
            return marks["##"].format(a=a, b=tok, word=a.removeprefix("##") + tok[2:])
    for mark in ("▁", "Ġ"):
        if any(t.startswith(mark) for t in tokens):
            return marks[mark]
    return ""
