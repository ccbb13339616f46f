"""The ColBERT checkpoints people download, read as sentence-transformers 6's
``MultiVectorEncoder`` reads them:

* **PyLate** folders (``modules.json`` of a Transformer and ``pylate.models.Dense.Dense``;
  ``config_sentence_transformers.json`` with ``query_prefix`` / ``document_prefix``,
  ``query_length``, ``document_length``, ``do_query_expansion``,
  ``attend_to_expansion_tokens``, ``skiplist_words``; ``model_type: "ColBERT"`` in PyLate 3);
* **Stanford ColBERT** folders (colbertv2.0: a Hugging Face BERT folder whose ``config.json``
  names ``HF_ColBERT``, with the projection ``linear.weight`` among the encoder's tensors and
  the settings in ``artifact.metadata``: ``query_maxlen``, ``doc_maxlen``,
  ``mask_punctuation``, ``query_token_id``, ``doc_token_id``, ``attend_to_mask_tokens``).

What they share: the markers become the ``"query"`` / ``"document"`` prompts (registered on the
tokenizer as single special tokens, so prepending them as text gives the trained token);
queries are expanded with mask tokens to a fixed length (:class:`Expansion`); punctuation is
left out of documents' rows by default.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..encoder.jsonfile import read_json_object, show
from ..errors import ModelFolderError

__all__ = [
    "Expansion",
    "LegacySettings",
    "expanded_batch",
    "key_masked_hidden",
    "mask_token_id",
    "read_expansion",
    "read_legacy_config",
    "read_stanford_metadata",
    "register_prefixes",
]

#: PyLate's and Stanford ColBERT's default skip-list
PUNCTUATION = list(string.punctuation)
#: the fields of ``config_sentence_transformers.json`` that mark a PyLate save
LEGACY_KEYS = (
    "query_length",
    "document_length",
    "query_expansion",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "attend_to_mask_tokens",
    "query_prefix",
    "document_prefix",
    "skiplist_words",
)
#: ColBERT's query length when a folder gives none
DEFAULT_QUERY_LENGTH = 32


@dataclass(frozen=True)
class Expansion:
    """ColBERT's query expansion. ``strategy``: ``"fixed"`` (every query exactly ``length``
    tokens: cut, or padded with ``token``) or ``"min"`` (padded up to ``length``, longer ones
    kept); ``attend``: whether the encoder attends to the added tokens (False: they are computed
    but no token looks at them); ``token``: the token added (None: the tokenizer's mask token)."""

    strategy: str = "fixed"
    attend: bool = False
    length: int = DEFAULT_QUERY_LENGTH
    token: str | None = None


def read_expansion(value: object, where: Path) -> Expansion | None:
    """A ``query_expansion`` object of ``where`` as an :class:`Expansion` (None for null);
    ``ModelFolderError`` naming the field for anything else."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"strategy", "attend", "token", "length"}:
        raise ModelFolderError(
            f"{where}: query_expansion {show(value)} must be an object with strategy, attend, "
            f"token and length (sentence-transformers' QueryExpansionConfig)."
        )
    strategy, attend = value.get("strategy"), value.get("attend", False)
    length, token = value.get("length"), value.get("token")
    if strategy not in ("fixed", "min") or not isinstance(attend, bool):
        raise ModelFolderError(
            f"{where}: query_expansion strategy {show(strategy)} / attend {show(attend)}: "
            f"expected strategy 'fixed' or 'min' and attend true or false."
        )
    if not isinstance(length, int) or isinstance(length, bool) or length < 3:
        raise ModelFolderError(
            f"{where}: query_expansion length must be an int >= 3 (the query's tokens after "
            f"expansion), got {show(length)}."
        )
    if token is not None and not isinstance(token, str):
        raise ModelFolderError(f"{where}: query_expansion token must be null or a token string.")
    return Expansion(strategy, attend, length, token)


@dataclass
class LegacySettings:
    """What a PyLate or Stanford ColBERT folder says beyond a sentence-transformers 6 one.
    ``prefixes``: the markers by task (registered on the tokenizer); ``prompts``: the prompts
    they make; ``transformer``: the Transformer's settings they give (``query_length``,
    ``document_length``, ``query_expansion`` as an :class:`Expansion` or None), which the
    folder's ``sentence_bert_config.json`` overrides; ``skiplist_words``: None when not given;
    ``pylate_v3``: ``model_type`` was ``"ColBERT"``."""

    prefixes: dict[str, str] = field(default_factory=dict)
    prompts: dict[str, str | None] = field(default_factory=dict)
    transformer: dict[str, Any] = field(default_factory=dict)
    skiplist_words: list[str] | None = None
    pylate_v3: bool = False

    def default_skiplist(self) -> list[str]:
        """The skip-list as sentence-transformers builds it: the folder's, else punctuation for
        a PyLate save (markers, or PyLate 3), else none."""
        if self.skiplist_words is not None:
            return self.skiplist_words
        return PUNCTUATION if (self.pylate_v3 or self.prefixes) else []


def read_legacy_config(cfg: dict, path: Path) -> LegacySettings:
    """The PyLate fields of ``config_sentence_transformers.json`` (``cfg``, read from ``path``)
    as a :class:`LegacySettings`; a sentence-transformers 6 config gives an empty one."""
    out = LegacySettings(pylate_v3=cfg.get("model_type") == "ColBERT")
    saved = dict(cfg.get("prompts") or {})
    for key, task in (("query_prefix", "query"), ("document_prefix", "document")):
        if key in cfg:
            prefix = cfg[key] or ""
            if not isinstance(prefix, str):
                raise ModelFolderError(f"{path}: {key} must be a string, got {show(prefix)}.")
            out.prefixes[task] = prefix
            rest = saved.get(task) or ""
            out.prompts[task] = prefix + (
                rest.removeprefix(prefix) if isinstance(rest, str) else ""
            )
    knobs = {k: cfg[k] for k in ("query_length", "document_length") if cfg.get(k) is not None}
    for k, v in knobs.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 3:
            raise ModelFolderError(f"{path}: {k} must be null or an int >= 3, got {show(v)}.")
    if "query_expansion" in cfg:
        knobs["query_expansion"] = read_expansion(cfg["query_expansion"], path)
    elif any(k in cfg for k in LEGACY_KEYS):
        knobs["query_expansion"] = _flat_expansion(cfg, knobs)
    out.transformer = knobs
    words = cfg.get("skiplist_words")
    if words is not None and (
        not isinstance(words, list) or not all(isinstance(w, str) for w in words)
    ):
        raise ModelFolderError(
            f"{path}: skiplist_words must be a list of strings, got {show(words)}."
        )
    out.skiplist_words = words
    return out


def _flat_expansion(cfg: dict, knobs: dict[str, Any]) -> Expansion | None:
    """PyLate's flat fields as an :class:`Expansion`: on unless ``do_query_expansion`` is
    false, to ``query_length`` tokens (taken out of ``knobs``: it is the expansion's length)."""
    if cfg.get("do_query_expansion") is False:
        return None
    attend = cfg.get("attend_to_expansion_tokens", cfg.get("attend_to_mask_tokens"))
    length = knobs.pop("query_length", None) or DEFAULT_QUERY_LENGTH
    return Expansion("fixed", bool(attend), length)


def read_stanford_metadata(root: Path) -> LegacySettings:
    """The settings of a Stanford ColBERT folder (``root/artifact.metadata``; its defaults when
    the file is absent): markers ``[unused0]`` / ``[unused1]``, queries expanded to
    ``query_maxlen`` (32), documents cut at ``doc_maxlen``, punctuation skipped unless
    ``mask_punctuation`` is false."""
    path = root / "artifact.metadata"
    meta = read_json_object(path) if path.is_file() else {}
    out = LegacySettings()
    for task, key, default in (("query", "query_token_id", "[unused0]"),
                               ("document", "doc_token_id", "[unused1]")):  # fmt: skip
        marker = meta.get(key) or default
        if not isinstance(marker, str):
            raise ModelFolderError(f"{path}: {key} must be a token string, got {show(marker)}.")
        out.prefixes[task] = out.prompts[task] = marker + " "
    length = meta.get("query_maxlen") or DEFAULT_QUERY_LENGTH
    doc = meta.get("doc_maxlen")
    for key, value in (("query_maxlen", length), ("doc_maxlen", doc)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 3
        ):
            raise ModelFolderError(f"{path}: {key} must be an int >= 3, got {show(value)}.")
    out.transformer = {"query_expansion": Expansion(
        "fixed", bool(meta.get("attend_to_mask_tokens")), length
    )}  # fmt: skip
    if doc is not None:
        out.transformer["document_length"] = doc
    out.skiplist_words = PUNCTUATION if meta.get("mask_punctuation", True) else []
    return out


# ---------------------------------------------------------------------- the tokenizer
def register_prefixes(tokenizer: Any, prefixes: dict[str, str]) -> list[str]:
    """Register each marker the vocabulary knows (the whole prefix, or its first word) as one
    special, unnormalized token of ``tokenizer`` (a :class:`bertattn.BertTokenizer`), where
    it would otherwise be split (``[unused0]`` -> ``[``, ``unused``, ``##0``, ``]``) or
    lowercased; returns the tokens registered."""
    from tokenizers import AddedToken

    raw = tokenizer._tok  # the wrapped tokenizers.Tokenizer
    vocab = raw.get_vocab(with_added_tokens=True)
    found: list[str] = []
    for value in prefixes.values():
        if not value or not value.split():
            continue
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in vocab:
                continue
            if raw.encode(prefix, add_special_tokens=False).tokens != [prefix]:
                found.append(prefix)
            break
    if found:
        raw.add_special_tokens([AddedToken(p, normalized=False, special=True) for p in found])
    return found


def mask_token_id(tokenizer: Any, folder: Path, token: str | None) -> int:
    """The id of the token queries are expanded with: ``token``, else the tokenizer's mask
    token (``tokenizer_config.json``'s ``mask_token``, ``[MASK]``, ``<mask>``)."""
    names = [token] if token is not None else []
    cfg_path = folder / "tokenizer_config.json"
    if token is None and cfg_path.is_file():
        mask = read_json_object(cfg_path).get("mask_token")
        mask = mask.get("content") if isinstance(mask, dict) else mask
        names += [mask] if isinstance(mask, str) else []
    names += [] if token is not None else ["[MASK]", "<mask>"]
    for name in names:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    raise ModelFolderError(
        f"{folder}: queries are expanded with {names[0]!r}, which the tokenizer does not have; "
        f"set query_expansion's token to one of its tokens."
    )


# ---------------------------------------------------------------------- the batch
def expanded_batch(
    batch: Any, expansion: Expansion, fill_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A padded query batch (``input_ids``, ``attention_mask``, ``token_type_ids``, each
    ``(B, L)``) widened to ``expansion.length`` where shorter, its padding within that length
    filled with ``fill_id``. Returns ``(ids, keys, types, scored)``, each ``(B, L')``:
    ``keys`` the tokens the encoder attends to (the real ones, and the added ones when
    ``expansion.attend``), ``scored`` the real and added tokens (they all get a row)."""
    ids, mask, types = batch.input_ids, batch.attention_mask.bool(), batch.token_type_ids
    missing = expansion.length - ids.shape[1]
    if missing > 0:
        ids = torch.nn.functional.pad(ids, (0, missing), value=0)
        mask = torch.nn.functional.pad(mask, (0, missing), value=False)
        types = torch.nn.functional.pad(types, (0, missing), value=0)
    added = ~mask & (torch.arange(ids.shape[1]) < expansion.length)  # (B, L')
    ids = ids.masked_fill(added, fill_id)
    keys = mask | added if expansion.attend else mask
    return ids, keys, types, mask | added


def key_masked_hidden(model: Any, ids: Tensor, keys: Tensor, types: Tensor) -> Tensor:
    """``(B, L, E)``: the last hidden state of every position of ``ids`` ``(B, L)`` where only
    the ``keys`` ``(B, L)`` positions are attended to, the others computed all the same (the
    padded path of :class:`bertattn.BertModel`: its embeddings, then its encoder stack's padded
    ``forward`` under a key padding mask; a packed run would leave those positions zero)."""
    from ..encoder.model import padded_mask

    hidden = model.embeddings(ids, types, None, None)  # (B, L, E)
    mask = padded_mask(model.encoder, keys, hidden, model.config.num_attention_heads)
    out, _ = model.encoder(hidden, mask)
    return out
