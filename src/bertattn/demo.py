"""The article's example, run on every backend: shapes, then each backend against ``math``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import BACKENDS, MultiHeadAttention, explain


@dataclass(frozen=True)
class BackendCheck:
    """One backend's run of the article's example."""

    requested: str
    ran: str
    reason: str
    max_abs_diff: float


@dataclass(frozen=True)
class ArticleDemo:
    """What ``bertattn demo`` reports."""

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    attention_shape: tuple[int, ...]
    checks: list[BackendCheck]


def run_article_demo(
    embed_dim: int = 512, num_heads: int = 8, batch_size: int = 2, seq_len: int = 10, seed: int = 0
) -> ArticleDemo:
    """The article's example (embed_dim 512, 8 heads, batch 2, seq_len 10), on every backend.

    The module runs in eval mode so that every backend sees the same (dropout-free) math.
    """
    torch.manual_seed(seed)
    x = torch.randn(batch_size, seq_len, embed_dim)
    mha = MultiHeadAttention(embed_dim, num_heads).eval()
    with torch.no_grad():
        mha.backend = "math"
        reference, attention = mha(x)  # (B, L, E), (B, H, L, L)
        checks = []
        for name in ["auto", *BACKENDS]:
            need = BACKENDS[name].returns_weights if name in BACKENDS else False
            mha.backend = name
            with explain() as log:
                out, _ = mha(x, need_weights=need)
            rec = log.records[-1]
            diff = (out - reference).abs().max().item()
            checks.append(BackendCheck(name, rec.backend, rec.reason, diff))
        mha.backend = "auto"
    shape_w = () if attention is None else tuple(attention.shape)
    return ArticleDemo(tuple(x.shape), tuple(reference.shape), shape_w, checks)
