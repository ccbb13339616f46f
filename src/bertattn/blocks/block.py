"""One transformer block around an attention call: pre-norm (ModernBERT) or post-norm (BERT,
GTE, NomicBERT, Jina v3)::

    pre-norm:   h = x + attend(attn_norm(x));    out = h + mlp(mlp_norm(h))
    post-norm:  h = attn_norm(x + attend(x));    out = mlp_norm(h + mlp(h))
    sandwich:   h = x + post_attn_norm(attend(attn_norm(x)))
                out = h + post_mlp_norm(mlp(mlp_norm(h)))     (Gemma 3: :class:`SandwichBlock`)

The residual stream stays in the norms' dtype (float32 under mixed precision); the attention
and the feed-forward run in their weights' dtype.

A quantizer may give a block a faster way to run itself (``fast_path``: int8 fuses the steps
around its products, :mod:`bertattn.encoder.int8_blocks`); it says per call whether it runs,
and where it does not the block runs as written here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from ..attention import MultiHeadAttention, PreparedMask

if TYPE_CHECKING:
    from ..attention.window import WindowedMask
    from .contract import Packing

__all__ = ["EncoderBlock", "SandwichBlock"]


class EncoderBlock(nn.Module):
    """``attn`` (a :class:`~bertattn.MultiHeadAttention`), ``mlp`` and their two norms
    (``attn_norm`` may be ``nn.Identity``: ModernBERT's first layer has none); ``prenorm``
    picks the order above; ``dropout``: on the attention and feed-forward outputs (training).

    ``fast_path`` (None unless a quantizer set one): ``fast_path(block, x, attend)`` returns
    the block's output computed its own way, or None where it does not run (then the block
    runs as written)."""

    fast_path: Callable[[EncoderBlock, Tensor, Callable[[Tensor], Tensor]], Tensor | None] | None
    fast_path = None

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        attn_norm: nn.Module,
        mlp_norm: nn.Module,
        *,
        prenorm: bool,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.attn_norm = attn_norm
        self.mlp_norm = mlp_norm
        self.prenorm = prenorm
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, attend: Callable[[Tensor], Tensor]) -> Tensor:
        """``x`` ``(..., E)`` -> ``(..., E)``; ``attend`` maps the attention's input (in the
        compute dtype) to its output (the caller holds the mask, rotation and window)."""
        fast = self.fast_path
        if fast is not None:
            out = fast(self, x, attend)
            if out is not None:
                return out
        cd = self.attn.out_linear.weight.dtype  # compute dtype; x (the residual) may be wider
        if self.prenorm:
            a = attend(_to(self.attn_norm(x), cd))
            h = x + _to(self.dropout(a), x.dtype)
            m = self.mlp(_to(self.mlp_norm(h), cd))
            return h + _to(self.dropout(m), h.dtype)  # (..., E)
        a = attend(_to(x, cd))
        h = self.attn_norm(x + _to(self.dropout(a), x.dtype))
        m = self.mlp(_to(h, cd))
        return self.mlp_norm(h + _to(self.dropout(m), h.dtype))  # (..., E)

    def run_padded(
        self, x: Tensor, mask: PreparedMask | WindowedMask, want: bool, **position: Any
    ) -> tuple[Tensor, Tensor | None]:
        """The block on padded ``x`` ``(B, L, E)``, its attention over ``mask`` with the
        ``position`` keywords of :meth:`~bertattn.MultiHeadAttention.attend` (``rotation``,
        ``relative``): the output ``(B, L, E)`` and, when ``want``, the attention weights
        ``(B, H, L, L)`` (None otherwise)."""
        got: list[Tensor | None] = [None]

        def attend(h: Tensor) -> Tensor:
            out, got[0] = self.attn.attend(h, mask, need_weights=want, **position)
            return out

        return self(x, attend), got[0]

    def run_packed(self, x: Tensor, packing: Packing, **position: Any) -> Tensor:
        """The block on packed real tokens ``x`` ``(T, E)`` -> ``(T, E)``, its attention on
        ``packing.backend`` with the ``position`` keywords of
        :meth:`~bertattn.MultiHeadAttention.attend_packed` (``rotation``, ``window``,
        ``relative``)."""

        def attend(h: Tensor) -> Tensor:
            return self.attn.attend_packed(
                h, packing.batch, backend=packing.backend, reason=packing.reason,
                requested=self.attn.backend, **position,
            )  # fmt: skip

        return self(x, attend)


class SandwichBlock(EncoderBlock):
    """A pre-norm block whose two branches are normed on their way out too (Gemma 3's four
    norms a layer): ``post_attn_norm`` on the attention's output and ``post_mlp_norm`` on the
    feed-forward's, before each is added to the residual (the sandwich line above)."""

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        norms: tuple[nn.Module, nn.Module, nn.Module, nn.Module],
        *,
        dropout: float = 0.0,
    ) -> None:
        """``norms``: ``(attn_norm, post_attn_norm, mlp_norm, post_mlp_norm)``, in the order
        the layer runs them."""
        attn_norm, post_attn_norm, mlp_norm, post_mlp_norm = norms
        super().__init__(attn, mlp, attn_norm, mlp_norm, prenorm=True, dropout=dropout)
        self.post_attn_norm = post_attn_norm
        self.post_mlp_norm = post_mlp_norm

    def forward(self, x: Tensor, attend: Callable[[Tensor], Tensor]) -> Tensor:
        """``x`` ``(..., E)`` -> ``(..., E)``, as :meth:`EncoderBlock.forward`."""
        cd = self.attn.out_linear.weight.dtype
        a = self.post_attn_norm(self.dropout(attend(_to(self.attn_norm(x), cd))))
        h = x + _to(a, x.dtype)
        m = self.post_mlp_norm(self.dropout(self.mlp(_to(self.mlp_norm(h), cd))))
        return h + _to(m, h.dtype)  # (..., E)


def _to(t: Tensor, dtype: object) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)  # type: ignore[arg-type]
