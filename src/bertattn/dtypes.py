"""The compute dtypes bertattn takes: one list of names and one check, :func:`parse_dtype`, that
every entry point calls (``Bert.load``, ``BertModel.from_pretrained`` and its ``torch_dtype``,
``BertModel.to_compute_dtype``, the heads through ``Bert.load``, and ``--dtype`` of the
command line's jobs). A refusal is one line naming the argument as its caller spells it, what
came, and what is accepted.

``"auto"`` has two meanings, and the caller names the one it gives (:data:`AUTO_MEANINGS`):

* ``"fastest"``: the dtype that is fastest on the device the model runs on
  (:func:`bertattn.choose_dtype`): :meth:`bertattn.Bert.load`, the heads, ``--dtype auto``;
* ``"checkpoint"``: the dtype the checkpoint was saved in (``dtype`` / ``torch_dtype`` of its
  ``config.json``, float32 when absent), as transformers means it:
  :meth:`bertattn.BertModel.from_pretrained`.

Torch is imported only when a value is resolved, so the command line's parser reads the names
without it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "AUTO",
    "AUTO_MEANINGS",
    "AutoMeaning",
    "COMMAND_LINE",
    "FLOATS",
    "INT8",
    "dtype_name",
    "parse_dtype",
]

#: the floating-point dtypes a model loads and computes in, in the order messages list them
#: (float16 and bfloat16 run as mixed precision: see :meth:`bertattn.BertModel.to_compute_dtype`)
FLOATS = ("float32", "float16", "bfloat16", "float64")
#: those ``--dtype`` offers: float64 is for oracles and tests, never faster
COMMAND_LINE = tuple(name for name in FLOATS if name != "float64")
#: the name that asks the caller's meaning of "auto" (:data:`AUTO_MEANINGS`)
AUTO = "auto"
#: the encoder's matrix products in int8 (``Bert.load`` and the sentence encoder's jobs only)
INT8 = "int8"

AutoMeaning = Literal["fastest", "checkpoint"]
#: what ``"auto"`` resolves to, by the meaning the caller passes to :func:`parse_dtype`
AUTO_MEANINGS: dict[str, str] = {
    "fastest": "the fastest dtype on the device the model runs on (bertattn.choose_dtype)",
    "checkpoint": "the dtype the checkpoint was saved in (config.json's dtype / torch_dtype, "
    "float32 when absent), as transformers means it",
}


def dtype_name(dtype: torch.dtype) -> str:
    """``dtype`` as bertattn spells it: its name without ``torch.`` (``"bfloat16"``)."""
    return str(dtype).replace("torch.", "")


def _listed(names: tuple[str, ...], auto: str | None, int8: bool, exact: bool) -> str:
    extra = (AUTO,) * (auto is not None) + (INT8,) * int8
    return ", ".join((*names, *extra)) + ("" if exact else " (a torch.dtype or its name)")


def parse_dtype(
    value: object,
    *,
    where: str = "dtype",
    names: tuple[str, ...] = FLOATS,
    auto: AutoMeaning | None = None,
    int8: bool = False,
    exact: bool = False,
) -> torch.dtype | str | None:
    """``value`` checked against ``names`` (a subset of :data:`FLOATS`) and resolved.

    Returns None for None; ``"auto"`` when ``auto`` names its meaning (the caller resolves it:
    :data:`AUTO_MEANINGS`); ``"int8"`` for ``"int8"`` or ``torch.int8`` when ``int8``; else the
    ``torch.dtype``, given as one or by its name (``"float16"``, ``"torch.float16"``, torch's
    alias ``"half"``); ``exact``: the listed names only, as the command line spells them,
    returned as they are.
    Refused: a string that names no torch dtype (or, ``exact``, none listed) and a dtype not
    accepted raise ``ValueError``, another type ``ArgumentTypeError``; each one line naming
    ``where`` (``"dtype"``, ``"torch_dtype"``, ``"--dtype"``), the value and the accepted
    names."""
    if auto is not None and auto not in AUTO_MEANINGS:
        raise ValueError(f"auto must be one of {', '.join(AUTO_MEANINGS)}, got {auto!r}.")
    spelled = value.strip() if isinstance(value, str) else value
    if value is None or (auto is not None and value == AUTO):
        return value
    if int8 and spelled == INT8:
        return INT8
    listed = _listed(names, auto, int8, exact)
    if exact:  # the command line's names, as they are spelled there: no torch needed
        if value not in names:
            raise ValueError(f"{where} {value!r} is not one of {listed}.")
        return value
    import torch

    if isinstance(spelled, str):
        found = getattr(torch, spelled.replace("torch.", ""), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"{where} {value!r} is not a torch dtype; use one of {listed}.")
    elif isinstance(spelled, torch.dtype):
        found = spelled
    else:
        from .arguments import ArgumentTypeError, describe

        raise ArgumentTypeError(f"{where} must be one of {listed}, got {describe(value)}.")
    if int8 and found == torch.int8:
        return INT8
    if dtype_name(found) not in names:
        raise ValueError(f"{where}={value!r} is not supported; use one of {listed}.")
    return found
