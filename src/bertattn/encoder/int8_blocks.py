"""int8 for every family built from the shared blocks (:class:`~bertattn.blocks.EncoderBlock`:
ModernBERT, GTE, NomicBERT, Jina v3, EuroBERT, Qwen3, ...): each matrix product of a block
becomes a :class:`Product` that runs in int8 once :meth:`Product.quantize` gave it its int8 weights.

BERT's own layer has a faster int8 layer of its own (:class:`bertattn.encoder.int8.Int8BertLayer`,
the quantize steps fused with its LayerNorms and GELU); a block's norms, activations, rotation and
attention differ from family to family, so here each product quantizes its input, multiplies in
int8 and dequantizes on its own, and everything between the products stays as the family wrote
it, in float32. The products of a block:

* ``attn.qkv_product``: the attention's fused q/k/v projection (``((H + 2 Hkv) D, E)``), through
  the attention's one seam for it (:meth:`bertattn.MultiHeadAttention.project_qkv` and the
  packed path call it when it is there);
* ``attn.out_linear`` and every ``nn.Linear`` of ``mlp`` (``fc_in`` / ``fc_out``, or the gated
  ``w_in`` / ``w_out``), replaced by a :class:`LinearProduct` that keeps the same parameters
  (the ``state_dict`` stays the checkpoint's).

A product runs its float32 product instead when int8 is switched off (``int8_enabled``), in
training, with autograd through its input, inside a recorded steps block, or on a non-CPU or
non-float32 input, as BERT's int8 layer does. SmoothQuant's factors come from what each product
saw on the calibration texts (:func:`observing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..attention import prepack as _prepack
from ..attention import steps as _steps

__all__ = [
    "LinearProduct",
    "Product",
    "QkvProduct",
    "install",
    "int8_runs",
    "observing",
    "products",
]

#: makes one int8 product: (weight (N, K), bias (N,) or None, SmoothQuant factors (K,) or None)
MakeInt8 = Callable[[Tensor, Tensor | None, Tensor | None], nn.Module]


def int8_runs(module: nn.Module, x: Tensor, around: torch.dtype = torch.float32) -> bool:
    """Whether ``module`` (with ``int8_enabled``) runs its int8 path on ``x``: eval mode, a CPU
    input without autograd, float32 or ``around`` (the dtype of the residual stream between
    int8 layers: :mod:`bertattn.encoder.int8_around`), outside a recorded steps block."""
    return (
        getattr(module, "int8_enabled", False)
        and not module.training
        and x.device.type == "cpu"
        and (x.dtype == torch.float32 or x.dtype == around)
        and not (torch.is_grad_enabled() and x.requires_grad)
        and not _steps._open_blocks
    )


class Product(nn.Module):
    """One product ``x @ W.T + b`` that runs in int8 once :meth:`quantize` was called.

    ``(..., K)`` -> ``(..., N)``. Subclasses say where the float weights are
    (:meth:`float_weights`). While :attr:`observing`, each float call keeps the per-channel
    maximum of ``|x|`` (``seen``, ``(K,)``) for SmoothQuant.
    """

    def _init_product(self) -> None:
        self.int8_enabled = True
        self.observing = False
        self.seen: Tensor | None = None

    def float_weights(self) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        low = self._modules.get("int8")
        if low is not None and int8_runs(self, x):
            return low(x)
        if self.observing:
            top = x.detach().reshape(-1, x.shape[-1]).abs().amax(0).float()
            self.seen = top if self.seen is None else torch.maximum(self.seen, top)
        weight, bias = self.float_weights()
        return _prepack.linear(x, weight, bias)

    def quantize(self, make: MakeInt8, alpha: float) -> None:
        """Give this product its int8 weights (``make``), with SmoothQuant's factors at
        strength ``alpha`` from what it saw while observing (none when it saw nothing or
        ``alpha`` is 0)."""
        weight, bias = self.float_weights()
        smooth = None
        if alpha > 0 and self.seen is not None:
            act = self.seen.clamp(min=1e-5)
            wmax = weight.detach().float().abs().amax(0).clamp(min=1e-5)
            smooth = (act**alpha / wmax ** (1.0 - alpha)).clamp(min=1e-5)
        self.int8 = make(weight, bias, smooth)
        self.seen = None


class LinearProduct(nn.Linear, Product):
    """An ``nn.Linear`` whose product runs in int8; it holds the original module's parameters
    (same tensors, same names), so readers of ``.weight`` and the ``state_dict`` see the
    checkpoint."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._init_product()

    def float_weights(self) -> tuple[Tensor, Tensor | None]:
        return self.weight, self.bias

    forward = Product.forward


class QkvProduct(Product):
    """The attention's fused q/k/v projection (:meth:`~bertattn.MultiHeadAttention.qkv_weight`)
    as a product; installed as the attention's ``qkv_product``."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_attn", attn)  # not a submodule: the attention owns this one
        self._init_product()

    def float_weights(self) -> tuple[Tensor, Tensor | None]:
        return self._attn.qkv_weight()  # type: ignore[operator]


def install(block: nn.Module) -> list[Product]:
    """Replace the products of ``block`` (an encoder block: ``attn`` and ``mlp``) by
    :class:`Product` modules, still in float32; return them."""
    attn, mlp = block.attn, block.mlp
    found: list[Product] = [QkvProduct(attn)]
    attn.qkv_product = found[0]
    attn.out_linear = LinearProduct(attn.out_linear)
    found.append(attn.out_linear)
    for name, child in list(mlp.named_children()):
        if type(child) is nn.Linear:
            setattr(mlp, name, LinearProduct(child))
            found.append(getattr(mlp, name))
    for p in found:  # new modules start in training mode: take the block's
        p.train(block.training)
    return found


def products(model: nn.Module) -> list[Product]:
    """Every :class:`Product` in ``model``."""
    return [m for m in model.modules() if isinstance(m, Product)]


@contextmanager
def observing(found: list[Product]) -> Iterator[None]:
    """Inside the block, each float call of a product in ``found`` keeps its input's range."""
    for p in found:
        p.observing = True
    try:
        yield
    finally:
        for p in found:
            p.observing = False
