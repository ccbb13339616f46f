"""Head kinds as records: what each kind of model bertattn runs is, in one vocabulary.

=============  =========================================  ==================  ===============
kind           detected from the folder by                served as           predict's task
=============  =========================================  ==================  ===============
sparse         ``modules.json`` with ``SpladePooling``;    sparse              --
               a ``BertForMaskedLM`` when asked (sparse)
multi-vector   ``MultiVectorMask``; a PyLate folder;      multi_vector        --
               an ``HF_ColBERT`` config (Stanford)
bge-m3         ``colbert_linear.pt``, ``sparse_linear.pt`` m3                  --
cross-encoder  a one-label sequence classifier             reranker            text-classification
classifier     a sequence classifier of several labels     classifier          text-classification
tagger         (a token classifier: run as an encoder)     --                  token-classification
fill-mask      (a masked LM: run as an encoder)            --                  fill-mask
embedding      anything else                               embedding           --
=============  =========================================  ==================  ===============

A record (:class:`HeadKind`) says how the kind is detected from a folder (``detect``, read from
the folder's files without loading weights), how it loads, the kind ``/info`` names
(``served``) and the routes that answer it, the task ``bertattn predict`` runs for its head and
the view ``bertattn attend`` shows. :func:`detect` asks the records in order, the kinds added
with :func:`register` first; :func:`served_kind` finds the record of a loaded model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ..encoder import ModelFolder, resolve_model
from ..encoder.folder import locate_model
from .config import HeadConfig, read_head_config

__all__ = [
    "FolderProbe",
    "HeadKind",
    "detect",
    "find",
    "kinds",
    "register",
    "served_kind",
    "sparse_rows",
    "unregister",
    "predicted",
]


class FolderProbe:
    """What detection reads of a model folder (``path``: a folder, a cached hub name, None for
    the default model), each file once. ``sparse``: the caller asked for SPLADE rows."""

    def __init__(self, path: str | Path | None, *, sparse: bool = False) -> None:
        self.path = path
        self.sparse = sparse
        self._texts: dict[str, str] = {}

    def text(self, name: str) -> str:
        """The text of the file ``name`` of the folder ("" when absent or unreadable)."""
        if name not in self._texts:
            self._texts[name] = ""
            try:
                file = locate_model(self.path) / name if self.path is not None else None
                if file is not None and file.is_file():
                    self._texts[name] = file.read_text(encoding="utf-8")
            except (OSError, ValueError):
                pass  # no folder, or an unreadable file: detection says no
        return self._texts[name]

    @cached_property
    def folder(self) -> ModelFolder:
        """The encoder's folder, read and checked (its errors propagate)."""
        return resolve_model(self.path)

    @cached_property
    def head(self) -> HeadConfig:
        """The head ``config.json`` declares (its errors propagate)."""
        return read_head_config(self.folder.model_dir, self.folder.root)

    @property
    def splade(self) -> bool:
        """SPLADE by the folder's own word: ``modules.json`` with ``SpladePooling`` (a plain
        ``BertForMaskedLM`` may be SPLADE or a plain BERT: only the caller can say)."""
        return "SpladePooling" in self.text("modules.json")

    @property
    def multi_vector(self) -> bool:
        """A multi-vector (ColBERT) folder: sentence-transformers' ``MultiVectorEncoder``
        (``modules.json`` with a ``MultiVectorMask``, or ``config_sentence_transformers.json``
        saying so), PyLate's (its Dense module, ``model_type`` ``"ColBERT"`` or its
        ``query_prefix``) or Stanford ColBERT's (``config.json`` naming ``HF_ColBERT``)."""
        modules, st = self.text("modules.json"), self.text("config_sentence_transformers.json")
        return (
            any(m in modules for m in ("MultiVectorMask", "pylate.models"))
            or any(m in st for m in ('"MultiVectorEncoder"', '"ColBERT"', '"query_prefix"'))
            or (not modules and '"HF_ColBERT"' in self.text("config.json"))
        )

    @property
    def m3(self) -> bool:
        """bge-m3: ``colbert_linear.pt`` and ``sparse_linear.pt`` beside the encoder's weights."""
        return all(
            (self.folder.model_dir / f).is_file() for f in ("colbert_linear.pt", "sparse_linear.pt")
        )

    def given(self) -> Any:
        """The path as given, or the default model's folder for None (what the head classes
        that read a sentence-transformers folder take)."""
        return self.folder.root if self.path is None else self.path


@dataclass(frozen=True)
class HeadKind:
    """One kind of model.

    Attributes:
        name: the kind, in bertattn's one vocabulary (``"cross-encoder"``, ``"multi-vector"``).
        describe: the loaded model in words, for messages and ``/info``.
        detect: whether a folder is of this kind (None: never chosen by detection; the folder
            runs as the encoder, e.g. a tagger's). It may raise ``ValueError`` for a folder
            that cannot run as asked.
        load: the loaded model of a probed folder; keywords ``dtype``, ``device``, ``threads``,
            ``backend``.
        encoder: the encoder's :class:`ModelFolder` of a probed folder (no weights read).
        served: the name ``/info`` gives the kind (``model_type``); None: not served.
        routes: the data routes that answer it (besides ``/tokenize`` and ``/decode``).
        answers: whether a loaded model is of this kind (the server's dispatch).
        wraps: the loaded model holds its encoder as ``.bert`` (else it is the encoder).
        token_rows: the server runs it through its token step (rows per input), not the
            model's own ``step()``.
        head: the ``config.json`` head it reads (:attr:`HeadConfig.kind`), if any.
        uses_pooler: its head reads the encoder's pooled output, so the encoder loads its pooler
            (else the encoder keeps quiet about a folder without pooler weights).
        task: the pipeline ``bertattn predict`` runs for that head (None: predict refuses).
        attend: what ``bertattn attend`` shows with the maps: ``"encoder"`` (nothing more),
            ``"decision"`` (the head's score or label), ``"maxsim"`` (each query token's match;
            needs ``--pair``).
        alias: the spelling :func:`bertattn.heads.auto.resolve_auto` returned before (kept).
        default: the kind of any folder no other kind claims (the embedder); the server's
            start-up line names the kind of every model but these.
    """

    name: str
    describe: Callable[[Any], str]
    detect: Callable[[FolderProbe], bool] | None = None
    load: Callable[..., Any] | None = None
    encoder: Callable[[FolderProbe], ModelFolder] = field(default=lambda p: p.folder)
    served: str | None = None
    routes: tuple[str, ...] = ()
    answers: Callable[[Any], bool] = field(default=lambda model: False)
    wraps: bool = True
    token_rows: bool = False
    head: str | None = None
    uses_pooler: bool = False
    task: str | None = None
    attend: str = "encoder"
    alias: str | None = None
    default: bool = False

    def reads(self, head: HeadConfig) -> bool:
        """Whether ``head`` (a checkpoint's ``config.json`` head) is the one this kind reads."""
        return head.kind == self.head


_KINDS: list[HeadKind] = []


def register(kind: HeadKind, *, first: bool = True) -> HeadKind:
    """Add ``kind`` (``first``: asked before the built-in kinds, so a folder or model it
    claims is its own); ``ValueError`` for a name already taken."""
    if find(kind.name) is not None:
        raise ValueError(
            f"head kind {kind.name!r} is registered already "
            f"({', '.join(k.name for k in _KINDS)}); give the new kind a name of its own."
        )
    if first:
        _KINDS.insert(0, kind)
    else:
        _KINDS.insert(len(_KINDS) - 1, kind)  # before embedding, which takes anything
    return kind


def unregister(name: str) -> None:
    """Remove the kind ``name`` (a test's toy kind, when it is done)."""
    _KINDS[:] = [k for k in _KINDS if k.name != name]


def kinds() -> tuple[HeadKind, ...]:
    """Every kind, in the order detection asks them."""
    return tuple(_KINDS)


def find(name: str) -> HeadKind | None:
    """The kind named ``name`` (its own name, or the spelling ``/info`` or ``resolve_auto``
    gives it), or None."""
    return next((k for k in _KINDS if name in (k.name, k.served, k.alias)), None)


def detect(path: str | Path | None, *, sparse: bool = False) -> tuple[HeadKind, FolderProbe]:
    """The kind of the folder ``path`` and its probe, read without loading weights.
    ``sparse``: run a ``BertForMaskedLM`` as SPLADE (``ValueError`` for another head)."""
    probe = FolderProbe(path, sparse=sparse)
    for kind in _KINDS:
        if kind.detect is not None and kind.detect(probe):
            return kind, probe
    raise AssertionError("the embedding kind takes any folder")  # pragma: no cover


def served_kind(model: Any) -> HeadKind:
    """The kind of a loaded model (the first whose ``answers`` says so)."""
    return next(k for k in _KINDS if k.answers(model))


def predicted(head: HeadConfig) -> HeadKind | None:
    """The kind whose pipeline ``bertattn predict`` runs for a checkpoint's head (one with a
    ``task``), or None: the kinds reading that head, told apart as detection does."""
    probe = FolderProbe(None)
    probe.__dict__["head"] = head  # what detection would read of the folder
    for kind in _KINDS:
        if kind.task and kind.reads(head) and (kind.detect is None or kind.detect(probe)):
            return kind
    return None


def sparse_rows(path: str | Path | None, asked: bool | None) -> bool:
    """Whether ``encode`` writes SPLADE rows for ``path``: by the folder's own word
    (SpladePooling) unless ``asked`` is False; a ``BertForMaskedLM`` too when ``asked``.
    False for a folder that cannot run as SPLADE (the caller refuses ``asked``)."""
    if asked is False or path is None:
        return False
    try:
        return bool(SPARSE.detect(FolderProbe(path, sparse=bool(asked))))  # type: ignore[misc]
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------- the built-in kinds
def _class(module: str, name: str) -> Any:
    """A head class, imported when first asked (the heads import torch and the encoder)."""
    import importlib

    return getattr(importlib.import_module(f"bertattn.heads.{module}"), name)


def _is(module: str, name: str) -> Callable[[Any], bool]:
    return lambda model: isinstance(model, _class(module, name))


def _labels(what: str) -> Callable[[Any], str]:
    def describe(model: Any) -> str:
        n = model.num_labels
        arch = model.head.architecture or "BertForSequenceClassification"
        return f"{what} ({arch}, {n} label{'s' if n != 1 else ''})"

    return describe


def _splade(p: FolderProbe) -> bool:
    if p.splade:
        return True
    return p.sparse and p.head.kind == "masked-lm"


def _splade_folder(p: FolderProbe) -> ModelFolder:
    from .sparse_folder import read_sparse_folder

    return read_sparse_folder(p.path)[0] if p.splade else p.folder


def _multi_vector_folder(p: FolderProbe) -> ModelFolder:
    from .multi_vector import read_multi_vector_folder

    return read_multi_vector_folder(p.path)[0]  # type: ignore[arg-type]


def _sequence(labels: Callable[[int], bool]) -> Callable[[FolderProbe], bool]:
    return lambda p: p.head.kind == "sequence-classification" and labels(p.head.num_labels)


def _encoder(p: FolderProbe) -> bool:
    """Any folder runs as an encoder, unless SPLADE rows were asked of it."""
    if p.sparse:
        raise ValueError(
            f"{p.folder.config_path}: architectures is {p.head.architecture or 'not given'}; "
            f"sparse (SPLADE) rows need a BertForMaskedLM checkpoint: drop --sparse."
        )
    return True


def _load_bert(p: FolderProbe, **load: Any) -> Any:
    from ..encoder import Bert

    return Bert.load(p.folder, **load)


SPARSE = HeadKind(
    "sparse",
    describe=lambda model: "a SPLADE model (BertForMaskedLM)",
    detect=_splade,
    load=lambda p, **load: _class("sparse", "SparseEncoder")(p.given(), **load),
    encoder=_splade_folder,
    served="sparse",
    routes=("/embed_sparse",),
    answers=_is("sparse", "SparseEncoder"),
    head="masked-lm",
    alias="masked-lm",
)
MULTI_VECTOR = HeadKind(
    "multi-vector",
    describe=lambda model: "a multi-vector (ColBERT-style) model",
    detect=lambda p: not p.sparse and p.multi_vector,
    load=lambda p, **load: _class("multi_vector", "MultiVectorEncoder")(p.path, **load),
    encoder=_multi_vector_folder,
    served="multi_vector",
    routes=("/embed_multi_vector", "/embed_all", "/rerank", "/v1/rerank"),
    answers=_is("multi_vector", "MultiVectorEncoder"),
    token_rows=True,
    attend="maxsim",
)
M3 = HeadKind(
    "bge-m3",
    describe=lambda model: "a bge-m3 model (dense, sparse and ColBERT outputs)",
    detect=lambda p: not p.sparse and p.m3,
    load=lambda p, **load: _class("m3", "M3Encoder")(p.given(), **load),
    served="m3",
    routes=("/embed_m3", "/embed_all"),
    answers=_is("m3", "M3Encoder"),
    token_rows=True,
    alias="m3",
)
CROSS_ENCODER = HeadKind(
    "cross-encoder",
    describe=_labels("a reranker"),
    detect=_sequence(lambda n: n == 1),
    load=lambda p, **load: _class("cross_encoder", "CrossEncoder")(p.folder, **load),
    served="reranker",
    routes=("/rerank", "/v1/rerank", "/predict"),
    answers=lambda m: _is("cross_encoder", "CrossEncoder")(m) and m.num_labels == 1,
    head="sequence-classification",
    uses_pooler=True,
    task="text-classification",
    attend="decision",
    alias="sequence-classification",
)
#: the same head and class as the reranker, with several labels: it only predicts
CLASSIFIER = replace(
    CROSS_ENCODER,
    name="classifier",
    describe=_labels("a classifier"),
    detect=_sequence(lambda n: n != 1),
    served="classifier",
    routes=("/predict",),
    answers=_is("cross_encoder", "CrossEncoder"),
)
TAGGER = HeadKind(
    "tagger",
    describe=lambda model: "a token classifier",
    head="token-classification",
    task="token-classification",
)
FILL_MASK = HeadKind(
    "fill-mask",
    describe=lambda model: "a masked language model",
    head="masked-lm",
    task="fill-mask",
)
EMBEDDING = HeadKind(
    "embedding",
    describe=lambda model: "a sentence-embedding model",
    detect=_encoder,
    load=_load_bert,
    served="embedding",
    routes=("/v1/embeddings", "/embeddings", "/embed", "/embed_all", "/embed_late_chunks"),
    answers=lambda model: True,
    wraps=False,
    token_rows=True,
    default=True,
)
_KINDS += [SPARSE, MULTI_VECTOR, M3, CROSS_ENCODER, CLASSIFIER, TAGGER, FILL_MASK, EMBEDDING]
