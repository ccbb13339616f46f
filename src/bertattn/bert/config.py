"""``BertConfig``: the hyper-parameters of a BERT encoder, read from a checkpoint's config.json."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

logger = logging.getLogger("bertattn.bert")

__all__ = ["BertConfig", "ACTIVATIONS"]

# hidden_act names of Hugging Face configs that bertattn implements (see model.activation)
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# config.json keys that change the architecture in ways bertattn does not implement, with the
# value that is harmless; anything else refused (the name and the value go in the message)
_REFUSED: dict[str, Any] = {
    "is_decoder": False,
    "add_cross_attention": False,
    "position_embedding_type": "absolute",
}
_MODEL_TYPES = ("bert", None)


@dataclass
class BertConfig:
    """A BERT encoder (the Hugging Face ``BertConfig`` fields bertattn uses).

    Validated on creation: a bad value raises ``ValueError`` naming the field.
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
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive int, got {value!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"BertConfig: the hidden size ({self.hidden_size}) is not a multiple of the "
                f"number of attention heads ({self.num_attention_heads})."
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"BertConfig.hidden_act={self.hidden_act!r} is not supported; "
                f"supported: {', '.join(ACTIVATIONS)}."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            p = getattr(self, name)
            if not isinstance(p, (int, float)) or not 0.0 <= float(p) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {p!r}.")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            raise ValueError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}.")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id={self.pad_token_id} is outside the vocabulary "
                f"(0..{self.vocab_size - 1})."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> BertConfig:
        """Build from a Hugging Face config dict; architecture changes bertattn does not
        implement are refused (``ValueError`` naming the setting), unknown keys ignored."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}.")
        model_type = data.get("model_type")
        if model_type not in _MODEL_TYPES:
            raise ValueError(
                f"{source}: model_type={model_type!r} is not supported; bertattn loads BERT "
                f"checkpoints (model_type 'bert')."
            )
        for key, harmless in _REFUSED.items():
            if key in data and data[key] not in (harmless, None):
                raise ValueError(
                    f"{source}: {key}={data[key]!r} is not supported; bertattn implements a BERT "
                    f"encoder with {key}={harmless!r}."
                )
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        ignored = sorted(k for k in data if k not in known and k not in _REFUSED)
        if ignored:
            logger.debug("%s: ignoring keys %s", source, ", ".join(ignored))
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        """Read a Hugging Face ``config.json``."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc}).") from None
        return cls.from_dict(data, source=str(path))
