"""Reading a family's ``config.json`` fields, refusing what bertattn does not reproduce by the
field's name: one line saying what came, what is loaded instead (``refuse``), the sizes
(``positive``) and the rotation's base (``rope_theta``)."""

from __future__ import annotations

from typing import Any

from ..errors import ModelFolderError

__all__ = ["positive", "refuse", "rope_theta"]


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
