"""Reading a family's ``config.json`` fields, refusing what bertattn does not reproduce by the
field's name: one line saying what came, what is loaded instead (``refuse``), the sizes
(``positive``, ``kv_heads``), the activation (``known_activation``), the rotation's base
(``rope_theta``) and, for the decoder-shaped families, BERT's sizes (``decoder_sizes``)."""

from __future__ import annotations

from typing import Any

from ..blocks import activation
from ..errors import ModelFolderError

__all__ = ["decoder_sizes", "known_activation", "kv_heads", "positive", "refuse", "rope_theta"]


def refuse(source: str, title: str, field: str, value: object, expected: str) -> ModelFolderError:
    """``source: field=value is not supported; bertattn loads <title> checkpoints with
    <expected>.`` (to raise)."""
    return ModelFolderError(
        f"{source}: {field}={value!r} is not supported; bertattn loads {title} checkpoints with "
        f"{expected}."
    )


def positive(data: dict[str, Any], field: str, default: int, source: str, title: str) -> int:
    """``data[field]`` (``default`` when absent), an int >= 1."""
    value = data.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise refuse(source, title, field, value, "an int >= 1")
    return value


def rope_theta(data: dict[str, Any], default: float, source: str, title: str) -> float:
    """The base of one default rotation: ``rope_parameters.rope_theta`` (transformers 5), else
    the top-level ``rope_theta`` (the hub's older folders), else ``default``. A scaled rotation
    (``rope_scaling``, another ``rope_type``) is refused."""
    if data.get("rope_scaling") is not None:
        raise refuse(source, title, "rope_scaling", data["rope_scaling"], "rope_scaling null")
    params = data.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise refuse(source, title, "rope_parameters", params,
                     "a dict with rope_type and rope_theta")  # fmt: skip
    if params.get("rope_type", "default") != "default":
        raise refuse(source, title, "rope_parameters.rope_type", params["rope_type"], "'default'")
    theta = params.get("rope_theta", data.get("rope_theta", default))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise refuse(source, title, "rope_parameters.rope_theta", theta, "a number > 0")
    return float(theta)


def kv_heads(data: dict[str, Any], heads: int, default: int, source: str, title: str) -> int:
    """``num_key_value_heads`` (``default`` when absent): an int >= 1 dividing ``heads``
    (``num_attention_heads``), so that each key/value head serves as many query heads."""
    value = positive(data, "num_key_value_heads", default, source, title)
    if heads % value:
        raise refuse(source, title, "num_key_value_heads", value,
                     f"a divisor of num_attention_heads ({heads})")  # fmt: skip
    return value


def known_activation(data: dict[str, Any], field: str, default: str, source: str) -> str:
    """``data[field]`` (``default`` when absent), an activation bertattn implements; another
    is refused as ``source: field='...' is not supported; bertattn implements ...``."""
    act = data.get(field, default)
    try:
        activation(act, field)
    except ValueError as exc:
        raise ModelFolderError(f"{source}: {exc}") from None
    return act


def decoder_sizes(
    data: dict[str, Any],
    shape: tuple[int, int, int],
    act: str,
    norm_eps: float,
    defaults: dict[str, Any],
) -> dict[str, Any]:
    """BERT's sizes (every job reads those) of a family built on a decoder's layer (Qwen3,
    EuroBERT, Gemma 3). ``shape``: the checked ``(hidden_size, num_hidden_layers,
    num_attention_heads)``; ``defaults``: the family's ``vocab_size``, ``intermediate_size``,
    ``max_position_embeddings`` and ``pad_token_id`` when the config has none. No dropout
    between layers; token type ids are read past (a pair's segments are not told apart)."""
    hidden, layers, heads = shape
    return {
        "model_type": "bert",
        "vocab_size": data.get("vocab_size", defaults["vocab_size"]),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": data.get("intermediate_size", defaults["intermediate_size"]),
        "hidden_act": act,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": data.get("attention_dropout", 0.0),
        "max_position_embeddings": data.get(
            "max_position_embeddings", defaults["max_position_embeddings"]
        ),
        "type_vocab_size": 2,
        "layer_norm_eps": norm_eps,
        "pad_token_id": data.get("pad_token_id", defaults["pad_token_id"]),
    }
