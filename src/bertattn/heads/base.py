"""The sentence-transformers surface the head classes share over their encoder ``bert`` (a
:class:`bertattn.Bert`): where they run (``device``, ``dtype``), how long an input may be
(``max_seq_length``), and ``encode_query`` / ``encode_document`` made from each class's own
``encode`` (its signature, less ``task``), with sentence-transformers' prompt rule."""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..arguments import check_bool, check_int, check_str, describe
from .config_view import ConfigView, config_view
from .missing import missing_attribute
from .model_card import EvaluationMetrics
from .saving import save_folder

__all__ = ["HeadSurface", "check_prompts", "task_encode"]

logger = logging.getLogger("bertattn.heads")


class HeadSurface:
    """The attributes a head class (a :class:`bertattn.CrossEncoder`, ``SparseEncoder``,
    ``MultiVectorEncoder``) shares with sentence-transformers' classes, read from its
    encoder ``self.bert``."""

    bert: Any
    prompts: dict[str, Any]
    default_prompt_name: str | None
    #: the prompt names each task looks for, in order: the first the model has is used
    TASK_PROMPTS: ClassVar[dict[str, tuple[str, ...]]] = {
        "query": ("query",),
        "document": ("document", "passage", "corpus"),
    }

    if not TYPE_CHECKING:  # (type checkers keep seeing only the real attributes)

        def __getattr__(self, name: str) -> Any:
            """Called only for a name not found: sentence-transformers' methods bertattn does not
            have (``fit``, ``to``, ``push_to_hub``, ...) raise an ``AttributeError`` saying
            what to use instead (:mod:`.missing`); any other, Python's own."""
            raise missing_attribute(type(self).__name__, name)

    @functools.cached_property
    def model_card_data(self) -> EvaluationMetrics:
        """What sentence-transformers' evaluators write on the model after they run: their
        metrics, kept in ``model_card_data.runs``."""
        return EvaluationMetrics()

    @functools.cached_property
    def config(self) -> ConfigView:
        """A read-only, transformers-like view of the model's config (``model_type``,
        ``hidden_size``, ``num_hidden_layers``, ...; on a classifier ``num_labels``,
        ``id2label``, ``label2id``): the folder's ``config.json`` over bertattn's defaults."""
        labels = getattr(self, "id2label", None)
        if labels is not None and not labels:  # a head with no names: transformers' names
            labels = {i: f"LABEL_{i}" for i in range(int(getattr(self, "num_labels", 0)))}
        return config_view(self.bert, labels)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the model holds (bertattn's ``BertTokenizer``, over Hugging Face
        ``tokenizers``): called on texts, ``encode_batch``, ``token_to_id``, ``decode``."""
        return self.bert.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        """The underlying encoder module (a :class:`bertattn.BertModel`, a ``torch.nn.Module``:
        ``(B, L)`` ids -> ``(B, L, E)`` hidden states); the head's layers are the class's
        own attributes."""
        return self.bert.model

    def _saved_files(self) -> dict[str, Any]:
        """The files :meth:`save` writes over the copied folder (a path in it -> the JSON
        keys written over that file, or a list for a whole file); each class says its own."""
        raise NotImplementedError

    def save(
        self,
        path: str | os.PathLike[str],
        model_name: str | None = None,
        create_model_card: bool = True,
        train_datasets: list[str] | None = None,
        safe_serialization: bool | None = True,
    ) -> Path:
        """Write the model to ``path`` (a new or empty folder) so that sentence-transformers
        and bertattn both load it with the same outputs: the folder it was loaded from (weights,
        tokenizer, modules), with the settings as they are now (prompts, default prompt,
        similarity, max length, ...). Whole or not at all (written under a temporary name, then
        renamed). Returns the folder's path; ``FileExistsError`` when ``path`` holds files.

        sentence-transformers' other arguments are taken and checked: ``model_name``,
        ``create_model_card``, ``train_datasets`` describe a model card, which bertattn does
        not write (the folder's own README is copied); ``safe_serialization``: the weights are
        copied in the format the folder has them (``model.safetensors`` for every folder
        bertattn loads), as sentence-transformers on transformers 5 also ignores ``False``."""
        _check_save_arguments(model_name, create_model_card, train_datasets, safe_serialization)
        return save_folder(self.bert.folder, path, self._saved_files())

    #: :meth:`save` (transformers' and sentence-transformers' other name)
    save_pretrained = save

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.bert.device

    @property
    def dtype(self) -> torch.dtype:
        """The encoder's compute dtype."""
        return self.bert.model.dtype

    @property
    def max_seq_length(self) -> int:
        """Tokens per input, specials included (settable), as sentence-transformers'."""
        return self.bert.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.bert.max_seq_length = check_int(value, "max_seq_length", low=3)

    def get_max_seq_length(self) -> int:
        """:attr:`max_seq_length` (sentence-transformers' accessor)."""
        return self.max_seq_length

    @staticmethod
    def merged_prompts(
        saved: dict[str, Any],
        saved_default: str | None,
        prompts: object,
        default_prompt_name: object,
    ) -> tuple[dict[str, Any], str | None]:
        """The prompts and default prompt name a head class's constructor keeps, as
        sentence-transformers merges them: ``prompts`` (given) over the folder's ``saved`` ones,
        ``default_prompt_name`` (given) else the folder's ``saved_default``. ``TypeError`` for
        ``prompts`` that are not a dict of str to str or a name that is not a str;
        ``ValueError`` for a default name that is not among the prompts."""
        check_prompts(prompts)
        if default_prompt_name is not None and not isinstance(default_prompt_name, str):
            raise TypeError(
                f"default_prompt_name must be a str (one of the prompts' names) or None, got "
                f"{describe(default_prompt_name)}."
            )
        merged = {**saved, **(prompts or {})}
        name = default_prompt_name if default_prompt_name is not None else saved_default
        if name is not None and name not in merged:
            raise ValueError(
                f"default_prompt_name {name!r} is not among the prompts {list(merged)}; name "
                f"one of them, or pass prompts={{{name!r}: '...'}}."
            )
        return merged, name

    def choose_prompt(
        self, prompt: str | None, prompt_name: str | None, unknown: str
    ) -> str | None:
        """sentence-transformers' rule: ``prompt`` wins (a warning when ``prompt_name`` is given
        too), else the prompt named ``prompt_name``, else the default prompt's, else None. A
        name the model has no prompt by: ``ValueError`` saying ``unknown``, formatted with
        ``name`` and ``names`` (the model's prompt names, a list). The callers check the types."""
        if prompt is not None:
            if prompt_name is not None:
                logger.warning(
                    "Provide either a `prompt`, a `prompt_name`, or neither, but not both. "
                    "Ignoring the `prompt_name` in favor of `prompt`."
                )
            return prompt
        if prompt_name is None:
            default = self.default_prompt_name
            return None if default is None else self.prompts.get(default)
        if prompt_name not in self.prompts:
            raise ValueError(unknown.format(name=prompt_name, names=list(self.prompts)))
        return self.prompts[prompt_name]

    def task_prompt_name(self, task: str, prompt_name: str | None, prompt: str | None) -> Any:
        """sentence-transformers' rule for ``encode_query`` / ``encode_document``: neither
        ``prompt`` nor ``prompt_name`` given and the model has one of the task's prompts
        (:attr:`TASK_PROMPTS`) -> that prompt's name; else ``prompt_name`` as given."""
        if prompt is None and prompt_name is None:
            return next((n for n in self.TASK_PROMPTS[task] if n in self.prompts), None)
        return prompt_name


def check_prompts(prompts: object) -> None:
    """``TypeError`` unless ``prompts`` is None or a dict of prompt names (str) to prompt texts
    (str), as every head class's constructor takes them."""
    if prompts is not None and (
        not isinstance(prompts, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items())
    ):
        raise TypeError(
            f"prompts must be a dict of names to prompt texts, e.g. {{'query': 'query: '}}, "
            f"got {describe(prompts)}."
        )


def _check_save_arguments(
    model_name: object, create_model_card: object, train_datasets: object, safe: object
) -> None:
    """The model-card and serialization arguments of :meth:`HeadSurface.save`, checked."""
    check_str(model_name, "model_name", optional=True)
    check_bool(create_model_card, "create_model_card")
    check_bool(safe, "safe_serialization", optional=True)
    if train_datasets is not None and (
        not isinstance(train_datasets, (list, tuple))
        or not all(isinstance(d, str) for d in train_datasets)
    ):
        raise TypeError(
            f"train_datasets must be a list of dataset names (str) or None, got "
            f"{describe(train_datasets)}."
        )


def task_encode(task: str, encode: Callable[..., Any], doc: str) -> Callable[..., Any]:
    """``encode_<task>`` of a head class: ``self.encode`` called by keyword, as
    sentence-transformers calls it, with ``task=task`` and the prompt of
    :meth:`HeadSurface.task_prompt_name` (``sentences=``, where ``encode`` takes it, passed as
    ``inputs``); it takes ``encode``'s arguments (less ``task``) in the same order, and shows
    that signature. Keywords ``encode`` does not name are passed to it as they came (as
    sentence-transformers passes them), so ``encode`` itself takes or refuses them. ``doc``: its
    docstring."""
    full = inspect.signature(encode)
    shown = full.replace(parameters=[p for p in full.parameters.values() if p.name != "task"])
    rest = next(
        (p.name for p in shown.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD),
        None,
    )
    name = f"encode_{task}"

    def method(self: HeadSurface, *args: Any, **kwargs: Any) -> Any:
        if "task" in kwargs:
            raise TypeError(
                f"{type(self).__name__}.{name}() sets task={task!r} itself; call "
                f"encode(task=...) for another task."
            )
        named = shown.parameters
        passed = {k: kwargs.pop(k) for k in list(kwargs) if rest is None and k not in named}
        given = dict(shown.bind(self, *args, **kwargs).arguments)
        given.pop(next(iter(shown.parameters)))  # self
        extra = given.pop(rest, {}) if rest is not None else {}
        if "sentences" in given:  # sentence-transformers' older name for the texts
            if given.get("inputs") is not None:
                raise TypeError(
                    f"{type(self).__name__}.{name}() takes the texts once: as inputs (the "
                    f"first argument) or as sentences=, not both."
                )
            given["inputs"] = given.pop("sentences")
        prompt_name, prompt = given.pop("prompt_name", None), given.pop("prompt", None)
        return self.encode(  # by keyword, as sentence-transformers calls it
            inputs=given.pop("inputs", None),
            prompt_name=self.task_prompt_name(task, prompt_name, prompt),
            prompt=prompt,
            task=task,
            **given,
            **extra,
            **passed,
        )

    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    method.__signature__ = shown  # type: ignore[attr-defined]
    return method
