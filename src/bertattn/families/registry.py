"""The family registry: one :class:`Family` record per architecture, keyed by ``model_type``.

Everything that differs between architectures is in a record, so that the encoder, the
checkpoint loader and the jobs ask the record instead of testing a ``model_type``:

* ``read_config``: the checkpoint's ``config.json`` as the fields of
  :class:`bertattn.encoder.config.BertConfig` (sizes every job reads) plus the architecture's own
  settings (``arch``, any object the family's ``build`` understands);
* ``rename``: the checkpoint's tensors under the family's canonical names (prefix dropped,
  fused or split tensors in the layout the encoder keeps), and ``key_map``: canonical name ->
  bertattn module name, strictly (both directions: :func:`inverse`);
* ``build``: the encoder's three parts, ``(embeddings, encoder, pooler | None)``, on
  :class:`bertattn.BertModel`'s contract (``embeddings(ids, types, positions, embeds)``,
  ``encoder(hidden, mask, want, collect)`` / ``encoder.forward_packed(...)``);
* capability flags: what a job may do with the family (``int8``, ``onnx``, ``steps`` (the
  page's recomputed steps view), ``cuda_graphs``), refused by the family's name otherwise.

An architecture joins by registering its record (one file in this package); no file of the
server, the batcher, the jobs or the CLI changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ..errors import ModelFolderError, UsageError

__all__ = [
    "CAPABILITIES",
    "CLASSIFIERS",
    "Family",
    "HeadSpec",
    "base_prefixes",
    "choose_task",
    "config_family",
    "get",
    "head_classes",
    "head_kind",
    "inverse",
    "lookup",
    "names",
    "register",
    "require",
    "task_classes",
]

#: the capability flags a record may hold, and what each lets a job do
CAPABILITIES = {
    "int8": "int8 weights (dtype='int8')",
    "onnx": "ONNX export (bertattn export-onnx)",
    "steps": "the article's recomputed steps (the page's steps view, attention_steps)",
    "cuda_graphs": "CUDA graph capture",
    "compile": "torch.compile of the encoder (compile=True)",
    "token_types": "token type (segment) embeddings",
}


@dataclass(frozen=True)
class HeadSpec:
    """A task head a family defines itself (ModernBERT's classifier: a prediction head on the
    pooled tokens, then a linear layer): the tensors it reads, name -> shape, for a config and
    a label count, and how to build it from them. The module maps the encoder's hidden states
    ``(B, L, E)`` and the attention mask ``(B, L)`` to ``(B, num_labels)`` logits and holds
    its last linear layer as ``classifier``. A ``"masked-lm"`` head instead maps ``(..., E)``
    states to ``(..., V)`` logits, in two steps, ``transform`` then ``decode`` (what fill-mask
    and SPLADE call); its ``build`` is given the encoder's word embeddings ``(V, E)`` as the
    tensor ``"@word_embeddings"``."""

    expected: Callable[[Any, int], dict[str, tuple[int, ...]]]
    build: Callable[[Any, int, dict[str, Tensor]], nn.Module]
    #: tensors the head reads when the file has them (a decoder tied to the embeddings)
    optional: Callable[[Any, int], dict[str, tuple[int, ...]]] = lambda config, n: {}


@dataclass(frozen=True)
class Family:
    """One architecture (see the module docstring for each part)."""

    name: str
    title: str
    read_config: Callable[[dict[str, Any], str], tuple[dict[str, Any], Any]]
    rename: Callable[[dict[str, Tensor], Any], dict[str, Tensor]]
    key_map: Callable[[Any, bool], dict[str, str]]
    build: Callable[[Any, str, bool], tuple[nn.Module, nn.Module, nn.Module | None]]
    #: the base model's prefix in a task checkpoint (``bert.``, ``model.``), after ``rename``
    prefix: str = "bert."
    #: names of task-head tensors (skipped and reported when the encoder loads)
    head_prefixes: tuple[str, ...] = ()
    #: rows of the checkpoint's position table before its first real position
    position_offset: Callable[[dict[str, Any]], int] = lambda data: 0
    #: whether a checkpoint of this family without a pooler deserves a warning
    pooler_expected: bool = False
    #: a tokenizer.json is required (vocab.txt alone would build another family's pipeline)
    needs_tokenizer_json: bool = False
    capabilities: frozenset[str] = field(default_factory=frozenset)
    #: heads of the family's own, by kind (``"sequence-classification"``); a kind missing
    #: here runs BERT's (the pooler, then the classifier)
    heads: dict[str, HeadSpec] = field(default_factory=dict)
    #: a sequence classifier's own first-token layer (its tensors' prefix after the family's
    #: renaming, and its activation), run before the classifier instead of the pooler:
    #: DistilBERT's ``pre_classifier`` + ReLU, ELECTRA's ``classifier.dense`` + GELU; None:
    #: the encoder's pooler (BERT's dense + tanh), or the family's own head in :attr:`heads`
    first_token_layer: tuple[str, str] | None = None
    #: the base model's other prefixes in task checkpoints (read as ``prefix``)
    other_prefixes: tuple[str, ...] = ()
    #: why a capability is missing, where the reason is more than "not implemented"
    #: (``{"steps": "MPNet's relative position bias"}``: what the missing step would be)
    missing: dict[str, str] = field(default_factory=dict)
    #: configs of another ``model_type`` this record reads, by a test of the whole config.json
    #: (Jina v3's hub folder declares ``xlm-roberta``): ``(model_type, test(data) -> bool)``
    claims: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = ()
    #: the family's task adapters: ``(arch, task | None, source) -> arch`` with that task
    #: chosen (an unknown one refused by name); None: the family has none
    choose_task: Callable[[Any, str | None, str], Any] | None = None
    #: the task adapters a config's ``arch`` has (empty: none)
    task_names: Callable[[Any], tuple[str, ...]] = lambda arch: ()
    #: the transformers task classes whose checkpoints this family's heads read, by
    #: ``config.json``'s ``architectures`` name -> head kind (:func:`task_classes`)
    head_classes: dict[str, str] = field(default_factory=dict)

    def why_not(self, capability: str) -> str:
        """What stands in the way of ``capability`` (for messages)."""
        return self.missing.get(capability, f"{self.title}'s layers")

    def can(self, capability: str) -> bool:
        """Whether this family has ``capability`` (a key of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise ValueError(
                f"unknown capability {capability!r}; valid ones: {', '.join(CAPABILITIES)}."
            )
        return capability in self.capabilities


_REGISTRY: dict[str, Family] = {}
#: model_type aliases (a config without one is read as BERT)
_ALIASES: dict[str | None, str] = {None: "bert"}


def register(family: Family, *aliases: str) -> Family:
    """Add ``family`` (and ``aliases``, other ``model_type`` values meaning the same)."""
    unknown = set(family.capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"family {family.name!r}: unknown capabilities {sorted(unknown)}.")
    _REGISTRY[family.name] = family
    for alias in aliases:
        _ALIASES[alias] = family.name
    return family


def names() -> tuple[str, ...]:
    """Every registered ``model_type`` (aliases included), sorted."""
    _load_all()
    return tuple(sorted({*_REGISTRY, *(a for a in _ALIASES if a is not None)}))


def lookup(
    model_type: str | None, source: str = "config", data: dict[str, Any] | None = None
) -> Family:
    """The record for a config's ``model_type`` (a record's :attr:`Family.claims` on ``data``,
    the whole config, first); an unknown one: ModelFolderError listing the registry."""
    _load_all()
    if data is not None:
        for claimant in _REGISTRY.values():
            if any(t == model_type and test(data) for t, test in claimant.claims):
                return claimant
    name = _ALIASES.get(model_type, model_type)
    family = _REGISTRY.get(name) if isinstance(name, str) else None
    if family is None:
        raise ModelFolderError(
            f"{source}: model_type={model_type!r} is not supported; bertattn loads "
            f"{', '.join(repr(n) for n in names())} checkpoints."
        )
    return family


def get(name: str) -> Family:
    """The record called ``name`` (a ``BertConfig.family``)."""
    return lookup(name, "model")


def config_family(data: dict[str, Any], source: str = "config") -> Family:
    """The record of a checkpoint's ``config.json`` (``data``, the whole object): by its
    ``model_type``, a record's claims first (see :func:`lookup`); an unknown one:
    ModelFolderError starting with ``source`` and listing the registry."""
    return lookup(data.get("model_type"), source, data)


def require(name: str, capability: str, job: str) -> None:
    """Refuse ``job`` by the family's name when it lacks ``capability``."""
    family = get(name)
    if not family.can(capability):
        raise ValueError(
            f"{job} is not available for {family.title} models ({name!r}): bertattn has no "
            f"{CAPABILITIES[capability]} for {family.why_not(capability)}."
        )


def choose_task(name: str, arch: Any, task: str | None, source: str) -> Any:
    """``arch`` (a config's of family ``name``) with the task adapter ``task`` chosen; a task
    for a family without adapters: UsageError (a ValueError) saying so."""
    family = get(name)
    if family.choose_task is not None:
        return family.choose_task(arch, task, source)
    if task is not None:
        raise UsageError(
            f"task={task!r}: {family.title} models ({name!r}) have no task adapters; load "
            f"{source} without task=."
        )
    return arch


def base_prefixes() -> tuple[str, ...]:
    """Every family's base-model prefix in task checkpoints (``bert.``, ``roberta.``,
    ``model.``, ...): a tensor under one is the encoder's, any other a head's."""
    _load_all()
    found = {f.prefix for f in _REGISTRY.values()}
    found |= {p for f in _REGISTRY.values() for p in f.other_prefixes}
    return tuple(sorted(found))


#: the two classifier head kinds most families have (:func:`task_classes`)
CLASSIFIERS = ("sequence-classification", "token-classification")
#: the ending of transformers' task class names, by head kind
_TASK_SUFFIXES = {
    "sequence-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "masked-lm": "ForMaskedLM",
}


def task_classes(stem: str, *kinds: str) -> dict[str, str]:
    """A record's :attr:`Family.head_classes`: transformers' class ``stem`` + the ending of each
    of ``kinds`` (``task_classes("Bert", "masked-lm")``: ``{"BertForMaskedLM": "masked-lm"}``)."""
    unknown = [k for k in kinds if k not in _TASK_SUFFIXES]
    if unknown:
        raise ValueError(f"unknown head kinds {unknown}; valid ones: {', '.join(_TASK_SUFFIXES)}.")
    return {stem + _TASK_SUFFIXES[kind]: kind for kind in kinds}


def head_classes() -> dict[str, str]:
    """Every record's task classes -> head kind; the default family's (BERT's) first, the
    others in the order they registered."""
    _load_all()
    default = _REGISTRY.get(str(_ALIASES[None]))
    records = [default] if default is not None else []
    records += [f for f in _REGISTRY.values() if f is not default]
    return {name: kind for f in records for name, kind in f.head_classes.items()}


def head_kind(architecture: str | None) -> str | None:
    """The head kind of a checkpoint whose ``architectures`` names ``architecture`` (None: a
    class no record reads)."""
    return head_classes().get(architecture or "")


def inverse(key_map: dict[str, str]) -> dict[str, str]:
    """bertattn name -> checkpoint name."""
    return {v: k for k, v in key_map.items()}


_LOADED = [False]


def _load_all() -> None:
    """Import every architecture file once (each registers its records)."""
    if _LOADED[0]:
        return
    _LOADED[0] = True
    from . import (  # noqa: F401
        bert,
        deberta_v2,
        distilbert,
        eurobert,
        gemma3,
        gte,
        jina_embeddings_v3,
        modernbert,
        mpnet,
        nomic_bert,
        qwen3,
    )
