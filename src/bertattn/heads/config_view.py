"""``model.config`` on the head classes: a read-only view shaped like transformers'
``PretrainedConfig`` (``model_type``, ``architectures``, ``hidden_size``, ``num_labels``,
``id2label`` with int keys, ``label2id``, ...), made from the folder's ``config.json`` over the
defaults of the fields bertattn reads, so code copied from transformers that reads
``model.config.id2label`` runs."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

from ..encoder.jsonfile import read_json_object

__all__ = ["ConfigView", "config_view"]


class ConfigView(Mapping[str, Any]):
    """A read-only mapping whose keys are also attributes (``config.num_labels`` and
    ``config["num_labels"]``); :meth:`to_dict` gives a copy. Setting a field raises
    ``AttributeError``: bertattn reads its settings from the folder when it loads."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(
                f"the model's config has no field {name!r}; it has {', '.join(sorted(self))}."
            ) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"model.config is read-only (setting {name!r}); edit the folder's config.json and "
            f"load it again."
        )

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def to_dict(self) -> dict[str, Any]:
        """The fields, a deep copy (transformers' ``PretrainedConfig.to_dict``: ``id2label``
        keeps its int keys)."""
        return copy.deepcopy(self._fields)

    def __repr__(self) -> str:
        return f"ConfigView({json.dumps(self._fields, default=str, sort_keys=True)[:400]})"


def config_view(bert: Any, id2label: Mapping[int, str] | None = None) -> ConfigView:
    """The :class:`ConfigView` of ``bert`` (a :class:`bertattn.Bert`): the fields of its
    config, under the folder's ``config.json`` (every field it has, as transformers keeps
    them), with ``model_type`` (the family when the file names none) and, when ``id2label`` is
    given (a classifier's labels), ``id2label`` / ``label2id`` / ``num_labels`` from it."""
    config = bert.model.config
    fields: dict[str, Any] = {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init
    }
    folder = getattr(bert, "folder", None)
    if folder is not None and folder.config_path.is_file():
        fields.update(read_json_object(folder.config_path))
    fields.setdefault("model_type", config.family)
    labels = fields.get("id2label") if id2label is None else id2label
    if isinstance(labels, Mapping):
        names = {int(k): str(v) for k, v in labels.items()}
        fields["id2label"] = names
        fields["label2id"] = {v: k for k, v in names.items()}
        fields["num_labels"] = len(names)
    return ConfigView(fields)
