"""The article's own PyTorch lines, step by step, as its ``MultiHeadAttention.forward`` writes
them: what the steps view (page and terminal) must show labelled "article (PyTorch)"."""

ARTICLE_LINES = {
    "qkv": ["q = self.q_linear(x)", "k = self.k_linear(x)", "v = self.v_linear(x)"],
    "split": [
        "q = q.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "k = k.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
        "v = v.view(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
    ],
    "scores": ["scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)"],
    "scaled": ["scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)"],
    "mask": ["if mask is not None:", "    scores = scores.masked_fill(mask == 0, -1e9)"],
    "softmax": ["attention = torch.softmax(scores, dim=-1)"],
    "dropout": ["attention = self.dropout(attention)"],
    "context": ["context = torch.matmul(attention, v)"],
    "merge": [
        "context = context.transpose(1, 2).contiguous().view(batch_size, -1, self.embed_dim)",
        "output = self.out_linear(context)",
    ],
}
