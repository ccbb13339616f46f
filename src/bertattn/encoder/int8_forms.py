"""The forms an int8 product can be called in on the CPU, and which of them are exact.

oneDNN's int8 linear (``torch.ops.onednn.qlinear_pointwise``) takes its activations signed
(``s8``) or unsigned (``u8``) and writes float32, bfloat16 or float16. Which form is fast is a
property of the CPU, not of int8 (measured, 2 threads, a 256x384 -> 1,536 product):

* AVX512-VNNI without AMX (an AMD EPYC Zen 4): the VNNI instruction multiplies *unsigned*
  bytes by signed ones, so ``u8 x s8 -> float32`` ran 4.6x float32's product while ``s8``
  activations fell to a reference kernel about 900x slower than float32, and a float16 output
  on a CPU without AVX512-FP16 too.
* AVX2 without VNNI (an AMD EPYC Zen 3): the u8 x s8 pair instruction (``vpmaddubsw``) adds two
  byte products into 16 bits and saturates (255 x 127 x 2 > 32,767): the product came out off
  by 10% of its largest value. With weights of 7 bits (``s7``: within +-63, so a pair's sum fits)
  the same kernel is exact, and ran 1.9-2.1x float32's product (1 thread, CPU time). The
  second feed-forward product (it reads GELU outputs) takes the other exact split there: 8-bit
  weights and 7-bit activations (``u7``: codes 0-127, 127 x 127 x 2 fits), measured closer to
  float32 on MiniLM's paragraphs (:func:`gelu_form`).
* AMX (Intel Xeon): both signednesses run on the tile unit.

So a form is kept only where it is timed fast *and* its product equals the exact integer
product (:func:`exact`): a saturating kernel is as wrong as a slow one is useless.

A u8 activation is the s8 one plus 128 (the same bits with the top one flipped), called with a
zero point of 128: the product the kernel returns is the s8 product, so everything after it
(the per-token zero-point correction) is the same in every form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..dtypes import dtype_name

__all__ = [
    "Form",
    "U8_F32",
    "U8_S7_F32",
    "S8_F32",
    "U8_BF16",
    "U8_F16",
    "candidates",
    "exact",
    "error",
    "gelu_form",
]

#: the largest relative error (of the product's largest magnitude) a form may show against the
#: exact integer product: float32's rounding, and half an ulp of the two 16-bit outputs
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-10}


@dataclass(frozen=True)
class Form:
    """How an int8 product is called: its activations' type (``"u8"`` or ``"s8"``), the
    dtype the product writes, and the bits of its signed weights (8, or 7 where the CPU's pair
    instruction would saturate on 8)."""

    activations: str
    out: torch.dtype
    weight_bits: int = 8
    #: 7: u8 codes 0-127 only (the activations' 7 bits; with 8-bit weights a pair's sum fits)
    activation_bits: int = 8

    def __post_init__(self) -> None:
        if self.activations not in ("u8", "s8"):
            raise ValueError(f"activations must be 'u8' or 's8', got {self.activations!r}.")
        if self.out not in TOLERANCE:
            raise ValueError(
                f"an int8 product writes float32, bfloat16 or float16, not {self.out}."
            )
        if self.weight_bits not in (7, 8):
            raise ValueError(f"weight_bits must be 7 or 8, got {self.weight_bits!r}.")
        if self.activation_bits not in (7, 8) or (self.activation_bits == 7 and not self.unsigned):
            raise ValueError(
                f"activation_bits must be 8, or 7 with u8 activations; got "
                f"{self.activation_bits!r} with {self.activations}."
            )

    @property
    def unsigned(self) -> bool:
        """The activations are passed as u8 (the s8 codes plus 128, zero point 128)."""
        return self.activations == "u8"

    @property
    def weight_limit(self) -> int:
        """The largest weight magnitude: 127 for 8 bits, 63 for 7."""
        return 2 ** (self.weight_bits - 1) - 1

    def __str__(self) -> str:
        acts = "u7" if self.activation_bits == 7 else self.activations
        return f"{acts} x s{self.weight_bits} -> {dtype_name(self.out)}"


def gelu_form(form: Form) -> Form:
    """The form of the product that reads GELU outputs (the second feed-forward linear) where
    the model's products run in ``form``: u7 x s8 in place of u8 x s7 (the same kernel, as
    exact, and on MiniLM's paragraphs its 7-bit activations lost less than 7-bit weights: mean
    cosine 0.99835 against 0.99769); ``form`` itself otherwise."""
    if form.unsigned and form.weight_bits == 7:
        return Form("u8", form.out, weight_bits=8, activation_bits=7)
    return form


U8_F32 = Form("u8", torch.float32)
U8_S7_F32 = Form("u8", torch.float32, weight_bits=7)
S8_F32 = Form("s8", torch.float32)
U8_BF16 = Form("u8", torch.bfloat16)
U8_F16 = Form("u8", torch.float16)


#: the flags of int8 instructions that accumulate in 32 bits (no 16-bit saturation)
VNNI_FLAGS = frozenset({"amx_int8", "avx512_vnni", "avx_vnni"})


def candidates(flags: set[str]) -> tuple[Form, ...]:
    """The forms worth timing on a CPU with these /proc/cpuinfo ``flags``: both float32
    forms everywhere, and 7-bit weights where the CPU has no VNNI or AMX (or its flags are
    unknown): there 8-bit weights saturate; a bfloat16 output only with native bfloat16
    (AVX512_BF16 or AMX), a float16 output only with native float16 (AVX512_FP16 or AMX-FP16):
    without them oneDNN converts on a reference path (a u8 -> float16 product took 2.96 s on a
    Zen 4, 1,700x float32)."""
    forms = [U8_F32, S8_F32]
    if not flags & VNNI_FLAGS:
        forms.append(U8_S7_F32)
    if flags & {"avx512_bf16", "amx_bf16"}:
        forms.append(U8_BF16)
    if flags & {"avx512_fp16", "amx_fp16"}:
        forms.append(U8_F16)
    return tuple(forms)


def error(got: Tensor, codes: Tensor, weight_int8: Tensor, scale: Tensor) -> float:
    """The largest error of a product ``got`` ``(M, N)`` of the signed ``codes`` ``(M, K)``
    by ``weight_int8`` ``(N, K)`` times the per-channel ``scale`` ``(N,)``, relative to the
    largest magnitude of the exact product (computed in float64: exact for any K here)."""
    want = (codes.double() @ weight_int8.double().T) * scale.double()
    top = float(want.abs().max())
    return float((got.double() - want).abs().max()) / (top if top > 0 else 1.0)


def exact(form: Form, err: float) -> bool:
    """Whether a product of ``form`` off by ``err`` (:func:`error`) is the exact product up
    to its output dtype's rounding (:data:`TOLERANCE`)."""
    return err <= TOLERANCE[form.out]
