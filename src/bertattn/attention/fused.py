"""The feed-forward block's first product with its bias and GELU as one oneDNN call on the CPU.

``gelu(x @ W.T + b)`` is three passes in eager PyTorch: the bias copied into the output, the
product added onto it, then GELU over the ``(T, I)`` result (a fresh tensor, the widest of the
layer). oneDNN's inner-product primitive applies the bias and the exact (erf) GELU to each
block of the output while it is still in registers: ``torch.ops.mkldnn._linear_pointwise(x,
W, b, "gelu", [], "none")``, the op torch's own compiler uses for this fusion.

Measured on a 2-core AMX Xeon (MiniLM widths, E 384 -> I 1536, median of 200 calls): in
bfloat16 0.72-0.83x the time of linear + gelu at every row count from 1 to 2,048, and the whole
bfloat16 ``encode`` 4-6% faster on paragraphs, 2-10% on short texts. In float32 the call alone
was no faster from 32 rows and slower below (1.47x at 9 rows), and the whole encode within 1%
either way, so float32 keeps the plain ops — unless oneDNN computes the process's float32
products anyway (:mod:`bertattn.attention.gemm`, chosen where it is faster than MKL), where
the bias and GELU come with the product for free.

It applies only where it computes what the plain ops do (the GELU before the output's one
rounding to bfloat16 rather than after it): the exact GELU, a bfloat16 CPU tensor and weight,
no autograd (the op has no backward). The first use in a process checks it against
``F.gelu(F.linear(...))`` on a small input; if the op is missing or disagrees, the plain ops
run from then on (logged once).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from . import gemm as _gemm
from . import prepack as _prepack

__all__ = ["linear_gelu"]

logger = logging.getLogger(__name__)

#: the dtypes it runs in (see above)
DTYPES = (torch.bfloat16,)

#: per dtype: True once checked and agreeing, False when missing or disagreeing
_checked: dict[torch.dtype, bool] = {}


def _op():  # type: ignore[no-untyped-def]
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _check(dtype: torch.dtype) -> bool:
    """Whether the fused op exists here and agrees with the plain ops in ``dtype``."""
    op = _op()
    ok = False
    if op is not None and torch.backends.mkldnn.is_available():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(40, 24, generator=g).to(dtype)
        w = (torch.randn(56, 24, generator=g) * 0.3).to(dtype)
        b = torch.randn(56, generator=g).to(dtype)
        try:
            with torch.no_grad():
                got = op(x, w, b, "gelu", [], "none").float()
            want = F.gelu(F.linear(x.float(), w.float(), b.float()))
            # float32: rounding; bfloat16: one rounding of the output (8 bits), and the products'
            tol = 1e-5 if dtype is torch.float32 else 2e-2
            ok = got.shape == want.shape and bool(torch.allclose(got, want, atol=tol, rtol=tol))
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            logger.info("fused linear + GELU unavailable (%s); running the plain ops", exc)
            ok = False
        if not ok:
            logger.info("fused linear + GELU disagrees in %s here; running the plain ops", dtype)
    _checked[dtype] = ok
    return ok


def linear_gelu(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """``gelu(linear(x, weight, bias))`` (exact GELU) as one oneDNN call, ``(..., K)`` ->
    ``(..., N)``; None where it does not apply (the caller runs the plain ops): not the CPU,
    autograd on, a dtype not in :data:`DTYPES` (float32: unless oneDNN was chosen for the
    process's float32 products), or the op missing or disagreeing."""
    dtype = x.dtype
    if dtype is torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled():
        # float32 where oneDNN computes the products anyway (attention/gemm.py): the epilogue
        # is free there; with MKL's products the fused call was no faster (see above)
        if _prepack.is_packed(weight) or not _gemm.uses_onednn(x, weight, bias):
            return None  # (a packed weight keeps MKL's packed product: the caller asked)
    elif (
        x.device.type != "cpu"
        or torch.is_grad_enabled()
        or dtype not in DTYPES
        or weight.dtype != dtype
        or (bias is not None and bias.dtype != dtype)
    ):
        return None
    ok = _checked.get(dtype)
    if ok is None:
        ok = _check(dtype)
    if not ok:
        return None
    if dtype is torch.float32:  # a short query's rows padded as gemm pads its products
        return _gemm._onednn(x, weight, bias, "gelu", "none")
    return _op()(x, weight, bias, "gelu", [], "none")  # type: ignore[misc]
