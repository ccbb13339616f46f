"""The article's steps for one head and one query token, taken from the real model.

:func:`attention_steps` runs the model once with the ``math`` backend on the asked layer and
keeps that backend's own intermediate values (:mod:`bertattn.attention.steps`), then cuts out
one head and one query row. Shapes (L tokens, D head size, E hidden size)::

    x (E,)  q (D,)  k (L, D)  v (L, D)  scores (L,)  scaled (L,)  bias (L,)  weights (L,)
    weighted_v (L, D)  context (D,)  output_share (E,)  output (E,)
    position_bias (L,) | None: MPNet's relative position bias, its own step (None for BERT)
    q_before (D,) | None, k_before (L, D) | None: before the rotation (rotary models only)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, describe, is_int

__all__ = ["AttentionSteps", "attention_steps", "find_token", "find_tokens"]


@dataclass
class AttentionSteps:
    """One head's attention for one query token, step by step (the article's order).

    Attributes:
        tokens: the text's tokens; ``query`` indexes them.
        layer, head, query: where the steps were taken.
        x: the query token's input to the layer's attention, ``(E,)``.
        q: its query vector in this head, ``(D,)``; k, v: every token's key and value, ``(L, D)``.
        scores: ``q · k_j`` per key ``(L,)``; scaled: ``scores / sqrt(D)``.
        bias: the mask as an additive bias per key (0 = attend, -inf = masked), ``(L,)``.
        weights: ``softmax(scaled + position_bias + bias)``, ``(L,)`` (equal to the head
            view's row).
        weighted_v: ``weights_j * v_j`` per key, ``(L, D)``; context: their sum, ``(D,)``.
        output_share: this head's context through its columns of the output projection, ``(E,)``.
        output: the attention output for the token (all heads merged, projected, bias added).
        position_bias: MPNet's relative position bias per key, ``(L,)``: its table's entry for
            this head and the bucket of ``key - query`` (:mod:`bertattn.blocks.relative`), added
            to the scaled scores in every layer; None for a model without one (BERT).
        q_before, k_before: a rotary model's query and keys before their rotation (``q`` and
            ``k`` are after it); None for a model without rotary positions.
        theta: the rotation's base (None: no rotation); window: the layer's local window
            (query i sees key j when ``|i - j| <= window``; None: every key).
    """

    tokens: list[str]
    layer: int
    head: int
    query: int
    x: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor
    scaled: Tensor
    bias: Tensor
    weights: Tensor
    weighted_v: Tensor
    context: Tensor
    output_share: Tensor
    output: Tensor
    position_bias: Tensor | None = None
    q_before: Tensor | None = None
    k_before: Tensor | None = None
    theta: float | None = None
    window: int | None = None

    @property
    def head_dim(self) -> int:
        return int(self.q.numel())

    def shares(self) -> Tensor:
        """Each key's share of the context: ``|w_j v_j| / sum_i |w_i v_i|``, ``(L,)``."""
        norms = self.weighted_v.norm(dim=-1)
        total = norms.sum()
        return norms / total if total > 0 else norms

    def table(self) -> str:
        """One line per key: token, q·k, /sqrt(d), the relative position bias (MPNet only),
        mask, weight, share of the context."""
        pos = self.position_bias
        lines = [
            f"layer {self.layer}, head {self.head}, query {self.query} "
            f"{self.tokens[self.query]!r} (d_k = {self.head_dim})",
            f"{'#':>4}  {'key':<16}{'q·k':>10}{'/√d':>9}{'+pos' if pos is not None else '':>8}"
            f"{'mask':>7}{'weight':>9}{'share':>8}",
        ]
        shares = self.shares()
        for j, tok in enumerate(self.tokens):
            mask = "0" if self.bias[j] == 0 else ("-inf" if self.bias[j] < -1e30 else "bias")
            if self.window is not None and abs(j - self.query) > self.window:
                mask = "win"  # outside the local window
            rel = f"{float(pos[j]):>8.3f}" if pos is not None else f"{'':>8}"
            lines.append(
                f"{j:>4}  {tok[:15]:<16}{float(self.scores[j]):>10.3f}{float(self.scaled[j]):>9.3f}"
                f"{rel}{mask:>7}{float(self.weights[j]):>9.4f}{float(shares[j]):>8.1%}"
            )
        if self.window is not None:
            lines.append(
                f"(win: -inf, outside the local window |j - {self.query}| <= {self.window}; "
                f"局部窗口之外)"
            )
        return "\n".join(lines)

    def _rotation_lines(self, j: int) -> list[str]:
        """The rotation step, for a rotary model: how q and k were turned, one pair shown."""
        if self.theta is None or self.q_before is None or self.k_before is None:
            return []
        d, i = self.head_dim, self.query
        angle = i * self.theta ** (-2 * 0 / d)  # pair 0 turns by the position itself
        a, b = float(self.q_before[0]), float(self.q_before[d // 2])
        before = float(self.q_before @ self.k_before[j])
        return [
            f"  rotate    = q and k turned pair by pair (i, i + d_k/2) by angle "
            f"position · θ^(-2i/d_k), θ = {self.theta:g}   (旋转位置编码：按位置旋转 q 和 k)",
            f"              q's pair 0 at position {i}: ({a:.3f}, {b:.3f}) turned by "
            f"{angle:.3f} rad -> ({float(self.q[0]):.3f}, {float(self.q[d // 2]):.3f})",
            f"              q · k_{j} before the rotation {before:.3f}, after "
            f"{float(self.scores[j]):.3f}: the score now depends on {i} - {j}",
        ]

    def formula(self) -> str:
        """The article's formula with this row's numbers filled in (the top key shown)."""
        d = self.head_dim
        j = int(self.weights.argmax())
        pos = self.position_bias
        logits = self.scaled + self.bias if pos is None else self.scaled + pos + self.bias
        exps = torch.exp(logits - logits.max())  # softmax, written out
        total, top = float(exps.sum()), float(exps[j])
        relative = []
        if pos is not None:
            relative = [
                f"  position  = table[bucket(j - {self.query}), head {self.head}]  (MPNet's "
                f"relative position bias, shared by every layer) -> {float(pos[j]):.3f}"
            ]
        e = int(self.x.numel())
        lines = [
            "Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k + "
            + ("position + " if pos is not None else "")
            + "mask) · V",
            f"  q, k, v   = x · W_q, x · W_k, x · W_v, cut into {e // d} heads of d_k = {d} "
            f"(head {self.head}: columns {self.head * d}..{(self.head + 1) * d - 1})",
            *_article("qkv", "split"),
            *self._rotation_lines(j),
            f"  scores    = q · k_j                 e.g. q · k_{j} ({self.tokens[j]!r}) = "
            f"{float(self.scores[j]):.3f}",
            f"  scaled    = scores / √{d} = scores / {math.sqrt(d):.3f}   -> "
            f"{float(self.scaled[j]):.3f}",
            *_article("scaled"),
            *relative,
            (
                f"  mask      = 0 for real tokens with |j - {self.query}| <= {self.window}, -inf "
                f"outside the window and for padding (局部注意力) -> {float(self.bias[j]):.0f}"
                if self.window is not None
                else f"  mask      = 0 for real tokens, -inf for padding            -> "
                f"{float(self.bias[j]):.0f}"
            ),
            *_article("mask"),
            f"  weights_j = exp(s_j - max s) / Σ_i exp(s_i - max s) = "
            f"{top:.4f} / {total:.4f} = {float(self.weights[j]):.4f}",
            *_article("softmax"),
            f"  context   = Σ_j weights_j · v_j      (|context| = {float(self.context.norm()):.3f},"
            f" top key {self.tokens[j]!r} gives {float(self.shares()[j]):.1%})",
            *_article("context"),
            f"  output   += W_o[:, head {self.head}] · context   "
            f"(|share| = {float(self.output_share.norm()):.3f} of |output| = "
            f"{float(self.output.norm()):.3f})",
            *_article("merge"),
        ]
        return "\n".join(lines)


def _article(*steps: str) -> list[str]:
    """The article's own lines of ``steps``, labelled, indented under the formula's line."""
    from ..viz.words import ARTICLE_CODE

    code = [line for step in steps for line in ARTICLE_CODE[step]]
    label = "article (PyTorch): "
    pad = " " * (_INDENT + len(label))
    return [f"{' ' * _INDENT}{label}{code[0]}", *(pad + line for line in code[1:])]


#: where the article's lines start under a formula line ("  scores    = " is 14 wide)
_INDENT = 14


def find_tokens(tokens: list[str], text: str) -> list[int]:
    """Every index whose token is ``text``: compared as is; if none, case-insensitively; if
    none, also without WordPiece's ``##`` ([] when none matches)."""
    for key in (lambda t: t, str.lower, lambda t: t.lower().removeprefix("##")):
        matches = [i for i, t in enumerate(tokens) if key(t) == key(text)]
        if matches:
            return matches
    return []


def check_query(value: object, name: str) -> None:
    """``value`` is a token index (an int, NumPy integers too) or a token's text (a str)."""
    if not (is_int(value) or isinstance(value, str)):
        raise ArgumentTypeError(
            f"{name} must be a token index (int) or a token's text (str), got {describe(value)}."
        )


def find_token(tokens: list[str], token: str | int) -> int:
    """The index of ``token`` (an index, or a token's text; the first match wins, compared
    as is, then case-insensitively, then without WordPiece's ``##``)."""
    check_query(token, "token")
    if is_int(token):
        token = int(token)
        if not -len(tokens) <= token < len(tokens):
            raise ValueError(
                f"token index {token} is out of range: the text has tokens 0..{len(tokens) - 1}."
            )
        return token % len(tokens)
    text = str(token)
    if re.fullmatch(r"-?[0-9]+", text.strip()):
        return find_token(tokens, int(text))
    matches = find_tokens(tokens, text)
    if matches:
        return matches[0]
    raise ValueError(
        f"token {text!r} is not in the text's tokens ({' '.join(tokens[:40])}"
        f"{' ...' if len(tokens) > 40 else ''}); give its index or one of these."
    )


def attention_steps(
    bert,  # type: ignore[no-untyped-def]
    text: str,
    *,
    layer: int,
    head: int,
    query: int | str,
    pair: str | None = None,
    max_length: int | None = None,
) -> AttentionSteps:
    """The steps of ``layer``/``head`` for the ``query`` token of ``text`` (see the class;
    the arguments as :meth:`bertattn.Bert.attention_steps` takes them)."""
    from ..attention.steps import record_steps

    cfg = bert.model.config
    for name, value, count in (
        ("layer", layer, cfg.num_hidden_layers),
        ("head", head, cfg.num_attention_heads),
    ):
        if not is_int(value):
            raise ArgumentTypeError(
                f"{name} must be an int in 0..{count - 1} (this model's {name}s), got "
                f"{describe(value)}."
            )
        if not 0 <= value < count:
            raise ValueError(
                f"{name} {value!r} is out of range: this model has {name}s 0..{count - 1}."
            )
    layer, head = int(layer), int(head)
    check_query(query, "query")
    with record_steps() as rec:
        maps = bert.attention_maps(text, pair, layers=[layer], max_length=max_length)
    if len(rec.records) != 1:
        raise RuntimeError(f"expected one math attention call, recorded {len(rec.records)}.")
    r = rec.records[0]
    try:
        i = find_token(maps.tokens, query)
    except ValueError as exc:
        raise ValueError(f"query {query!r}: {exc}") from None
    with torch.no_grad():
        steps = _cut(r, maps.tokens, layer, head, i)
        table = bert.model.encoder.relative_table()
        if table is not None:  # MPNet: the relative position bias as its own step
            steps.position_bias = _relative_row(table, len(maps.tokens), head, i)
            steps.bias = steps.bias - steps.position_bias  # the mask alone (exact: see below)
        return steps


def _relative_row(table: Tensor, length: int, head: int, i: int) -> Tensor:
    """MPNet's relative position bias of query ``i`` in ``head``, ``(L,)`` float32: the
    entry the ``math`` backend added (the recorded bias is this plus the mask's 0 / -inf, so
    subtracting it leaves the mask exactly)."""
    from ..blocks.relative import position_bias

    return position_bias(table, length)[0, head, i].to("cpu", torch.float32)


def _cut(r, tokens: list[str], layer: int, head: int, i: int) -> AttentionSteps:  # type: ignore[no-untyped-def]
    """Head ``head``, query row ``i`` of the record ``r``, in float32 on the CPU."""
    d = r.q.size(-1)
    sl = slice(head * d, (head + 1) * d)
    f32 = torch.float32
    q, k, v = (t.to("cpu", f32) for t in (r.q[0, head, i], r.k[0, head], r.v[0, head]))
    bias = torch.zeros(k.size(0), dtype=f32)
    if r.bias is not None:
        bias = bias + r.bias.to(f32).expand(1, r.q.size(1), r.q.size(2), k.size(0))[0, head, i]
    weights = r.weights[0, head, i].to(f32)
    context = r.context[0, head, i].to(f32)
    merged = r.context[0, :, i].to(f32).reshape(-1)  # (E,): every head's context, in order
    w_out = r.out_weight.to(f32)  # type: ignore[union-attr]
    output = w_out @ merged
    if r.out_bias is not None:
        output = output + r.out_bias.to(f32)
    return AttentionSteps(
        tokens=tokens,
        layer=layer,
        head=head,
        query=i,
        x=r.x[0, i].to(f32),  # type: ignore[index]
        q=q,
        k=k,
        v=v,
        scores=r.scores[0, head, i].to(f32),
        scaled=r.scaled[0, head, i].to(f32),
        bias=bias,
        weights=weights,
        weighted_v=weights[:, None] * v,
        context=context,
        output_share=w_out[:, sl] @ context,
        output=output,
        q_before=None if r.q_before is None else r.q_before[0, head, i].to("cpu", f32),
        k_before=None if r.k_before is None else r.k_before[0, head].to("cpu", f32),
        theta=r.theta,
        window=r.window,
    )
