"""What an int8 model computes around its int8 products: float32, or bfloat16 ("int8+bf16").

Between the products of :class:`~bertattn.encoder.int8.Int8BertLayer` lie the residual stream,
the two LayerNorms, the GELU and the attention. With ``int8_around="bfloat16"`` the residual
stream between layers and the attention's q, k, v and context are bfloat16 (the attention runs
its bfloat16 kernel, scores and softmax in float32 as in every bfloat16 model); the fused steps
around each product (dequantize, residual add, LayerNorm, GELU, quantize) read and write
bfloat16 and compute in float32 registers. That halves the memory those steps move, and the
attention's products run at bf16's rate: OpenVINO's default on CPUs with native bfloat16.

Where bfloat16 is emulated (no AVX512_BF16 or AMX) it only adds conversions, so ``"auto"``
(the default of ``Bert.load(dtype="int8")``) takes bfloat16 only where ``dtype="auto"`` would
(:func:`bertattn.choose_dtype`: the timed probe of the model's own products, the CPU's flags
where it cannot time). The families built from blocks keep float32 around their products
(:mod:`bertattn.encoder.int8_blocks`): ``"auto"`` gives them float32, ``"bfloat16"`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..arguments import check_choice
from ..dtypes import dtype_name
from .auto_dtype import DtypeChoice, choose_dtype

__all__ = ["AROUNDS", "Around", "FLOAT32_AROUND", "check_around", "choose_around"]

#: the values ``int8_around`` takes
AROUNDS = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class Around:
    """The dtype around an int8 model's products and why it was taken (one line)."""

    dtype: torch.dtype
    reason: str
    #: chosen by ``"auto"`` (so a bfloat16 mix refused by the fidelity check falls back)
    auto: bool = False

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)} around them ({self.reason})"


#: what an int8 model had before ``int8_around`` (and what :func:`quantize_model` gives unasked)
FLOAT32_AROUND = Around(torch.float32, "int8_around='float32'")


def check_around(value: object) -> str:
    """``value`` if it is one of :data:`AROUNDS` (``ValueError`` / ``TypeError`` naming it)."""
    return check_choice(value, "int8_around", AROUNDS)  # type: ignore[return-value]


def choose_around(
    value: object,
    *,
    blocks: str | None = None,
    widths: tuple[int, int] | None = None,
    threads: int | None = None,
    choice: DtypeChoice | None = None,
) -> Around:
    """The :class:`Around` ``value`` (:data:`AROUNDS`) gives a model.

    ``blocks``: for a model built from :mod:`bertattn.blocks`, its layers named (``"modernbert's
    EncoderBlock"``; their products run in int8 one by one, with float32 around them):
    ``"bfloat16"`` is refused (``ValueError``) and ``"auto"`` gives float32. ``"auto"``
    otherwise takes bfloat16 where ``choice`` (default: :func:`~bertattn.choose_dtype` on the
    CPU at ``widths`` ``(hidden, intermediate)`` and ``threads``) is bfloat16, else float32."""
    value = check_around(value)
    if blocks and value == "bfloat16":
        raise ValueError(
            f"int8_around='bfloat16' covers BERT's int8 layer only; this model's layers are "
            f"{blocks}, whose int8 products keep float32 around them: pass "
            f"int8_around='float32' or 'auto'."
        )
    if value == "float32":
        return FLOAT32_AROUND
    if value == "bfloat16":
        return Around(torch.bfloat16, "int8_around='bfloat16'")
    if blocks:
        return Around(
            torch.float32,
            f"auto: {blocks} layers keep float32 around their int8 products",
            auto=True,
        )
    if choice is None:
        choice = choose_dtype("cpu", threads=threads, widths=widths)
    dtype = torch.bfloat16 if choice.dtype == torch.bfloat16 else torch.float32
    return Around(dtype, f"auto: {choice.reason}", auto=True)
