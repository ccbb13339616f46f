"""int8 for every family built from the shared blocks (:class:`~bertattn.blocks.EncoderBlock`:
ModernBERT, GTE, NomicBERT, Jina v3, EuroBERT, Qwen3, ...): each matrix product of a block
becomes a :class:`Product` that runs in int8 once :meth:`Product.quantize` gave it its int8 weights.

BERT's own layer has an int8 layer of its own (:class:`bertattn.encoder.int8.Int8BertLayer`,
the quantize steps fused with its LayerNorms and GELU); a block's rotation and attention differ
from family to family, so there each product quantizes its input, multiplies in int8 and
dequantizes on its own, in float32, while the feed-forward half is fused whatever the family
(below). The products of a block:

* ``attn.qkv_product``: the attention's fused q/k/v projection (``((H + 2 Hkv) D, E)``), through
  the attention's one seam for it (:meth:`bertattn.MultiHeadAttention.project_qkv` and the
  packed path call it when it is there);
* ``attn.out_linear`` and every ``nn.Linear`` of ``mlp`` (``fc_in`` / ``fc_out``, or the gated
  ``w_in`` / ``w_out``), replaced by a :class:`LinearProduct` that keeps the same parameters
  (the ``state_dict`` stays the checkpoint's).

Once quantized, a block whose norms and feed-forward are of the kinds written in
:mod:`bertattn.encoder.int8_steps` runs its feed-forward half fused (:func:`fuse`, the block's
``fast_path``): the attention output plus the residual, the norm and the quantize of the
first feed-forward input in one kernel; that product's dequantize and activation (times the
gate) in one, the quantize for the second in another; the second's dequantize, the residual
and the post-norm block's last norm in one. Same arithmetic as the products one by one, fewer passes
over the rows and fewer calls.

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
from ..attention.fastcall import hook_free
from ..blocks.block import EncoderBlock
from ..blocks.feedforward import FeedForward, GatedFeedForward
from .int8_steps import Norm, block_kernels, norm_parts

__all__ = [
    "FusedPlan",
    "LinearProduct",
    "Product",
    "QkvProduct",
    "fuse",
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


# ---------------------------------------------------------------------------- fused block
class FusedPlan:
    """What the fused steps of one block read (:func:`fuse`): the feed-forward's two products
    (``first``: ``(I, E)`` or gated ``(2I, E)``; ``second``: ``(E, I)``), its activation and
    whether it is gated, and the block's two norms in the order the steps take them (pre-norm:
    ``mlp_norm`` then none; post-norm: ``attn_norm`` then ``mlp_norm``)."""

    def __init__(self, block: EncoderBlock) -> None:
        mlp = block.mlp
        gated = type(mlp) is GatedFeedForward
        self.first: Product = mlp.w_in if gated else mlp.fc_in  # type: ignore[assignment]
        self.second: Product = mlp.w_out if gated else mlp.fc_out  # type: ignore[assignment]
        self.gated = gated
        self.act = mlp.act
        self.prenorm = block.prenorm
        self.norms = (block.mlp_norm,) if block.prenorm else (block.attn_norm, block.mlp_norm)
        #: the modules whose own call the fused steps stand in for (hook-free, or not fused)
        self.stand_in: tuple[nn.Module, ...] = (mlp, self.first, self.second, *self.norms)

    def norms_now(self) -> tuple[Norm, Norm]:
        """The two norms as the steps take them, read now (a norm's weight may have changed)."""
        parts = [norm_parts(m) for m in self.norms]
        first = parts[0]
        second = parts[1] if len(parts) > 1 else None
        return first, second  # type: ignore[return-value]


def why_not_fused(block: nn.Module) -> str | None:
    """None when :func:`fuse` can fuse ``block``'s feed-forward half; else why not."""
    if type(block) is not EncoderBlock:
        return f"a {type(block).__name__}, not an EncoderBlock"
    mlp = block.mlp
    if type(mlp) not in (FeedForward, GatedFeedForward):
        return f"a {type(mlp).__name__} feed-forward"
    names = ("w_in", "w_out") if type(mlp) is GatedFeedForward else ("fc_in", "fc_out")
    if not all(isinstance(getattr(mlp, n), LinearProduct) for n in names):
        return "feed-forward linears that are not int8 products"
    norms = (block.mlp_norm,) if block.prenorm else (block.attn_norm, block.mlp_norm)
    for n in norms:
        why = norm_parts(n)
        if isinstance(why, str):
            return why
    return None


def fuse(block: nn.Module) -> bool:
    """Give ``block`` (its products installed and quantized) the fused feed-forward half as
    its ``fast_path`` where :func:`why_not_fused` finds nothing against it; whether it did."""
    if why_not_fused(block) is not None:
        return False
    block.plan = FusedPlan(block)  # type: ignore[union-attr]
    block.fast_path = run_fused  # type: ignore[union-attr]
    return True


def run_fused(block: EncoderBlock, x: Tensor, attend: Callable[[Tensor], Tensor]) -> Tensor | None:
    """``block`` on ``x`` ``(..., E)`` with its feed-forward half fused; None (the block runs
    as written) where its products would not run in int8 (:func:`int8_runs`) or a module the
    steps stand in for has hooks."""
    plan: FusedPlan = block.plan  # type: ignore[assignment]
    first, second = plan.first, plan.second
    low_in, low_out = first._modules.get("int8"), second._modules.get("int8")
    if low_in is None or low_out is None or not (int8_runs(first, x) and int8_runs(second, x)):
        return None
    if not all(hook_free(m) for m in (*plan.stand_in, low_in, low_out)):
        return None
    e = x.shape[-1]
    a = attend(block.attn_norm(x) if plan.prenorm else x)
    norm_a, norm_b = plan.norms_now()
    kern = block_kernels()
    h, q, s, sz = kern.residual_norm_quantize(
        a.reshape(-1, e), x.reshape(-1, e), norm_a, plan.prenorm,
        low_in.inv_smooth, low_in.levels, low_in.unsigned,
    )  # fmt: skip
    v = kern.dequantize_act(low_in.matmul(q), s, sz, low_in.bias, low_in.col, plan.act, plan.gated)
    q, s, sz = kern.quantize(v, low_out.inv_smooth, low_out.levels, low_out.unsigned)
    out = kern.dequantize_residual_norm(
        low_out.matmul(q), s, sz, low_out.bias, low_out.col, h, norm_b
    )
    return out.view(x.shape)  # (..., E)
