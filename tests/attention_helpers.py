"""Helpers shared by the tests of ``bertattn.attention`` (tests/test_attention_*.py) and of
the blocks built on it (tests/test_blocks*.py)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

import bertattn
from bertattn.bench.article import ArticleMultiHeadAttention

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOW_PRECISION = (torch.bfloat16, torch.float16)


def padded_backends() -> list[str]:
    """Registered backends that take any mask on (B, H, L, D) (``varlen`` has its own tests)."""
    return [n for n, spec in bertattn.BACKENDS.items() if spec.layout == "padded"]


def backend_names() -> list[str]:
    """Every padded-layout backend, then ``auto``."""
    return [*padded_backends(), "auto"]


def returns_weights(backend: str) -> bool:
    """Whether a call on ``backend`` may ask for weights (auto: yes, it picks math)."""
    return backend == "auto" or bertattn.BACKENDS[backend].returns_weights


def article_pair(
    embed_dim: int = 16, num_heads: int = 4, seed: int = 0
) -> tuple[ArticleMultiHeadAttention, bertattn.MultiHeadAttention]:
    """The article's class with random weights and ours with the same weights, both in eval."""
    torch.manual_seed(seed)
    article = ArticleMultiHeadAttention(embed_dim, num_heads).eval()
    ours = bertattn.MultiHeadAttention(embed_dim, num_heads).eval()
    ours.load_state_dict(article.state_dict(), strict=True)
    return article, ours


def random_module(
    embed_dim: int, num_heads: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> bertattn.MultiHeadAttention:
    """Ours with random (non-zero) weights and biases, in eval, in ``dtype``."""
    torch.manual_seed(seed)
    m = bertattn.MultiHeadAttention(embed_dim, num_heads).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.5)
    return m.to(dtype)


def noisy(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with seeded N(0, 0.3) noise added to every parameter (so that no weight is
    a neutral 0 or 1), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


def upcast(m: bertattn.MultiHeadAttention, dtype=torch.float64) -> bertattn.MultiHeadAttention:
    """A copy of ``m`` in ``dtype`` (same values), the reference of the relative rule."""
    return copy.deepcopy(m).to(dtype)


def keep_mask(shape: tuple[int, ...], gen: torch.Generator, *, p: float = 0.5) -> Tensor:
    """A random bool keep-mask (True = attend) with at least one kept key in every row."""
    keep = torch.rand(shape, generator=gen) < p
    first = torch.randint(0, shape[-1], shape[:-1], generator=gen)
    keep.scatter_(-1, first[..., None], True)
    return keep


def causal(length: int) -> Tensor:
    """(L, L) lower-triangular keep-mask."""
    return torch.ones(length, length, dtype=torch.bool).tril()


def max_err(a: Tensor, ref: Tensor) -> float:
    return (a.double() - ref.double()).abs().max().item()
