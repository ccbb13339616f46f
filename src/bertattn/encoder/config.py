"""``BertConfig``: the hyper-parameters of a BERT encoder, read from a checkpoint's config.json."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ModelFolderError
from .jsonfile import check_int, check_real, check_str, json_type, read_json

logger = logging.getLogger("bertattn.encoder")

__all__ = ["BertConfig", "ACTIVATIONS", "check_against_tensors", "check_values"]

# hidden_act names of Hugging Face configs that bertattn implements (see model.activation)
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# config.json keys that change the architecture in ways bertattn does not implement, with the
# value that is harmless; anything else refused (the name and the value go in the message)
_REFUSED: dict[str, Any] = {
    "is_decoder": False,
    "add_cross_attention": False,
    "position_embedding_type": "absolute",
}


@dataclass
class BertConfig:
    """A BERT encoder (the Hugging Face ``BertConfig`` fields bertattn uses).

    Validated on creation (types and ranges, see :func:`check_values`): a bad value raises
    ``ValueError`` naming the field; :meth:`from_dict` / :meth:`from_json_file` raise
    :class:`~bertattn.errors.ModelFolderError` naming the file too.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    #: rows of MPNet's relative position bias table (buckets x heads), shared by every layer
    #: and added to every layer's scaled scores (:mod:`.relative`); 0: no such bias (BERT)
    relative_attention_num_buckets: int = 0
    #: width of the embedding tables when it is not ``hidden_size`` (ELECTRA-small's 128): a
    #: linear projection to ``hidden_size`` follows them; None: the hidden size
    embedding_size: int | None = None
    #: rows of the checkpoint's position table before its first real position (RoBERTa's
    #: ``pad_token_id + 1``; 0 for BERT): dropped when its weights load. Not a field: the
    #: encoder built from this config is a BERT, whose positions start at 0
    position_offset: ClassVar[int] = 0
    #: the checkpoint's family, a record of :mod:`bertattn.families` (its ``model_type``, or
    #: the name an alias stands for); also not a field
    family: ClassVar[str] = "bert"
    #: the architecture's own settings beyond BERT's (rotary bases, windows, norms: what the
    #: family's ``read_config`` returned), None for BERT's layer; not a field
    arch: ClassVar[object] = None

    def __post_init__(self) -> None:
        try:
            check_values(self.__dict__)
        except ValueError as exc:
            raise ValueError(f"BertConfig: {exc}") from None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> BertConfig:
        """Build from a Hugging Face config dict; architecture changes bertattn does not
        implement are refused, unknown keys ignored. Every problem raises
        :class:`~bertattn.errors.ModelFolderError` (a ``ValueError``) that starts with
        ``source`` (the file) and names the field."""
        if not isinstance(data, dict):
            raise ModelFolderError(
                f"{source}: expected a JSON object ({{...}}), got a JSON {json_type(data)}."
            )
        from ..families import registry

        family = registry.config_family(data, source)  # unknown: refused, listing all
        offset = family.position_offset(data)
        data, arch = family.read_config(data, source)
        for key, harmless in _REFUSED.items():
            if key in data and data[key] not in (harmless, None):
                raise ModelFolderError(
                    f"{source}: {key}={data[key]!r} is not supported; bertattn implements a BERT "
                    f"encoder with {key}={harmless!r}."
                )
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        ignored = sorted(k for k in data if k not in known and k not in _REFUSED)
        if ignored:
            logger.debug("%s: ignoring keys %s", source, ", ".join(ignored))
        try:
            check_values({**_DEFAULTS, **kwargs})
        except ValueError as exc:
            raise ModelFolderError(f"{source}: {exc}") from None
        config = cls(**kwargs)
        config.position_offset = offset
        config.family = family.name
        config.arch = arch
        return config

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        """Read a Hugging Face ``config.json`` (UTF-8 JSON object; see :meth:`from_dict`)."""
        return cls.from_dict(read_json(path), source=str(path))


_DEFAULTS = {f.name: f.default for f in fields(BertConfig)}

#: a layer's index in a tensor name of every family (``encoder.layer.3.``, ``layers.3.``)
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
#: the vocabulary's embedding table, ``(vocab, width)``, in every family
_WORD_TABLE = re.compile(r"(?:^|\.)(?:word_embeddings|tok_embeddings)\.weight$")


def check_against_tensors(
    config: BertConfig, shapes: Mapping[str, tuple[int, ...]], *, config_source: str, weights: str
) -> None:
    """The sizes ``config`` claims against the checkpoint's tensors (``shapes``: name ->
    shape), before any module or key map is built from them: a ``num_hidden_layers`` above the
    layers the tensor names hold, or a width the vocabulary's table does not have, raises
    :class:`ModelFolderError` naming ``config_source`` (config.json), the field and the value
    to write. (A config.json claiming a million layers cost gigabytes before it was refused.)"""
    found = {int(m.group(1)) for name in shapes if (m := _LAYER_INDEX.search(name))}
    layers = max(found) + 1 if found else 0
    if config.num_hidden_layers > layers:
        holds = f"{layers} layers (0 to {layers - 1})" if layers else "no layer tensors"
        raise ModelFolderError(
            f"{config_source}: num_hidden_layers={config.num_hidden_layers} but {weights} "
            f"holds {holds}; the config.json belongs to another model: use the one that came "
            f"with these weights (num_hidden_layers={layers})."
        )
    field = "hidden_size" if config.embedding_size is None else "embedding_size"
    width = getattr(config, field)
    for name, shape in shapes.items():
        if _WORD_TABLE.search(name) and len(shape) == 2 and shape[1] != width:
            raise ModelFolderError(
                f"{config_source}: {field}={width} but {weights} has {name} of shape "
                f"{tuple(shape)}: its vectors are {shape[1]} wide; use the config.json that came "
                f"with these weights ({field}={shape[1]})."
            )


_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


def check_values(values: dict[str, Any]) -> None:
    """Type and range of every :class:`BertConfig` field in ``values``; ``ValueError`` whose
    message starts with the field name and says what to write instead."""
    for name in _POSITIVE_INTS:
        check_int(name, values[name], minimum=1)
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if hidden % heads != 0:
        raise ValueError(
            f"the hidden size ({hidden}) is not a multiple of the number of attention heads "
            f"({heads}): hidden_size must be divisible by num_attention_heads."
        )
    check_str("hidden_act", values["hidden_act"], choices=ACTIVATIONS)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        check_real(name, values[name], low=0.0, high=1.0, hint="write a probability such as 0.1")
    check_real(
        "layer_norm_eps",
        values["layer_norm_eps"],
        low=0.0,
        low_open=True,
        hint="write a small positive number such as 1e-12",
    )
    from ..blocks.relative import NUM_BUCKETS

    buckets = values.get("relative_attention_num_buckets", 0)
    check_int("relative_attention_num_buckets", buckets, minimum=0)
    if 0 < buckets < NUM_BUCKETS:
        raise ValueError(
            f"relative_attention_num_buckets={buckets} is below the {NUM_BUCKETS} relative "
            f"position buckets MPNet computes: write 0 (no relative position bias) or at least "
            f"{NUM_BUCKETS}."
        )
    check_int("embedding_size", values.get("embedding_size"), minimum=1, null=True)
    vocab = values["vocab_size"]
    check_int(
        "pad_token_id",
        values["pad_token_id"],
        minimum=0,
        maximum=vocab - 1,
        null=True,
        hint=f"write the id of the padding token (0..{vocab - 1}), or null",
    )
