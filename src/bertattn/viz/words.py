"""The words the steps are taught with, shared by the page (``attention.js``) and the terminal
(``bertattn attend --explain``).

:data:`ARTICLE_CODE` holds the article's own PyTorch lines for each of its nine steps, as its
``MultiHeadAttention.forward`` writes them (the page embeds them in its data and shows them
labelled "article (PyTorch)"; the terminal prints them under the formula's lines).
"""

from __future__ import annotations

__all__ = ["ARTICLE_CODE", "STEP_NAMES"]

#: the article's steps, in its order
STEP_NAMES: tuple[str, ...] = (
    "qkv",
    "split",
    "scores",
    "scaled",
    "mask",
    "softmax",
    "dropout",
    "context",
    "merge",
)

#: step name -> the article's line(s) for it, verbatim (③ and ④ are one line in the article)
ARTICLE_CODE: dict[str, tuple[str, ...]] = {
    "qkv": (
        "q = self.q_linear(x)",
        "k = self.k_linear(x)",
        "v = self.v_linear(x)",
    ),
    "split": (
        "q = q.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "k = k.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "v = v.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
    ),
    "scores": ("scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)",),
    "scaled": ("scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)",),
    "mask": (
        "if mask is not None:",
        "    scores = scores.masked_fill(mask == 0, -1e9)",
    ),
    "softmax": ("attention = torch.softmax(scores, dim=-1)",),
    "dropout": ("attention = self.dropout(attention)",),
    "context": ("context = torch.matmul(attention, v)",),
    "merge": (
        "context = context.transpose(1, 2).contiguous().view(batch_size, -1, self.embed_dim)",
        "output = self.out_linear(context)",
    ),
}
