"""The article's ``MultiHeadAttention``, rewritten faithfully (the seed article).

It is the oracle of the tests and a peer in the benchmarks (``bertattn bench``); it is kept
inside the package so that ``bertattn bench`` runs from an installed copy too. The only change
from the printed code is the parse error fixed: the comment "# 应用 mask（如有）" swallowed the line
``if mask is not None:``; here that ``if`` is on its own line. Everything else, including the
``-1e9`` fill and the dropout on the returned attention, is kept as the article has it.
"""

import math

import torch
import torch.nn as nn


class ArticleMultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        assert embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"

        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads

        # 线性变换层，用于生成 Q、K、V
        self.q_linear = nn.Linear(embed_dim, embed_dim)
        self.k_linear = nn.Linear(embed_dim, embed_dim)
        self.v_linear = nn.Linear(embed_dim, embed_dim)

        # 输出层和 dropout
        self.out_linear = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        batch_size = x.size(0)

        # 生成 Q、K、V
        q = self.q_linear(x)
        k = self.k_linear(x)
        v = self.v_linear(x)

        # 分割多头
        q = q.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)

        # 计算注意力分数
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)

        # 应用 mask（如有）
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)

        # 计算注意力权重
        attention = torch.softmax(scores, dim=-1)
        attention = self.dropout(attention)

        # 加权求和
        context = torch.matmul(attention, v)

        # 合并多头
        context = context.transpose(1, 2).contiguous().view(batch_size, -1, self.embed_dim)

        # 输出
        output = self.out_linear(context)

        return output, attention
