"""One transformer block around an attention call: pre-norm (ModernBERT) or post-norm (BERT,
GTE, NomicBERT, Jina v3)::

    pre-norm:   h = x + attend(attn_norm(x));    out = h + mlp(mlp_norm(h))
    post-norm:  h = attn_norm(x + attend(x));    out = mlp_norm(h + mlp(h))

The residual stream stays in the norms' dtype (float32 under mixed precision); the attention
and the feed-forward run in their weights' dtype.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..attention import MultiHeadAttention

__all__ = ["EncoderBlock"]


class EncoderBlock(nn.Module):
    """``attn`` (a :class:`~bertattn.MultiHeadAttention`), ``mlp`` and their two norms
    (``attn_norm`` may be ``nn.Identity``: ModernBERT's first layer has none); ``prenorm``
    picks the order above; ``dropout``: on the attention and feed-forward outputs (training)."""

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


def _to(t: Tensor, dtype: object) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)  # type: ignore[arg-type]
