"""One head's steps for one query token (:class:`AttentionSteps`, the values
:func:`bertattn.encoder.steps.attention_steps` takes from the real model) and how ``bertattn
attend --explain`` prints them in the terminal: a table (one line per key) and the article's
formula with that row's numbers, in English or Chinese.

The Chinese words are the page's (``attention.js``: 键, 权重, 掩码, 查询词元, 文章（PyTorch）);
columns are padded by display width (:func:`bertattn.viz.words.ljust`), so a row of CJK tokens
lines up with the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention.steps import PositionSteps
from .words import ARTICLE_CODE, check_lang, display_width, ljust, rjust, subword_note

__all__ = ["AttentionSteps", "steps_formula", "steps_table"]

#: the terminal's words, by language; the Chinese ones as the page writes them
WORDS: dict[str, dict[str, str]] = {
    "en": {
        "where": "layer {l}, head {h}, query {i} {tok!r} (d_k = {d})",
        "key": "key", "mask": "mask", "weight": "weight", "share": "share",
        "win": "(win: -inf, outside the local window |j - {i}| <= {w})",
        "article": "article (PyTorch): ",
        "split": "x · W_q, x · W_k, x · W_v, cut into {H} heads of d_k = {d} "
        "(head {h}: columns {a}..{b})",
        "eg": "e.g. q · k_{j} ({tok!r}) = {v}",
        "rotate": "q and k turned pair by pair (i, i + d_k/2) by angle "
        "position · θ^(-2i/d_k), θ = {theta}",
        "pair0": "q's pair 0 at position {i}: ({a}, {b}) turned by {angle} rad -> ({c}, {e})",
        "before": "q · k_{j} before the rotation {before}, after {after}: the score now depends "
        "on {i} - {j}",
        "position": "table[bucket(j - {i}), head {h}]  (MPNet's relative position bias, shared "
        "by every layer) -> {v}",
        "c2p": "q · Pk[r({i}, j)] / {root}  (DeBERTa's content-to-position term: the query's "
        "content against where key j is from it, r = bucket({i} - j)) -> {v}",
        "p2c": "k_j · Pq[r'(j, {i})] / {root}  (DeBERTa's position-to-content term: key j's "
        "content against where the query is from it, r' = -bucket(j - {i})) -> {v}",
        "maskwin": "0 for real tokens with |j - {i}| <= {w}, -inf outside the window and for "
        "padding -> {v}",
        "maskpad": "0 for real tokens, -inf for padding -> {v}",
        "masknone": "nothing to mask: one text (or pair) has no padding, so 0 for all {n} keys",
        "context": "(|context| = {norm}, top key {tok!r} gives {share})",
        "output": "(|share| = {share} of |output| = {norm})",
        "shared": "{kv} key/value heads, each shared by {g} query heads: head {h} reads key/value "
        "head {kvh} (k, v cut into {kv} heads, not {H})",
        "qknorm": "q / rms(q) · w_q and k / rms(k) · w_k over d_k, per head, before the product "
        "-> rms(q) = {rms}",
        "scale": "scores · {s} (the model's scale, not 1/√{d} = {a})   -> {v}",
    },
    "zh": {
        "where": "第 {l} 层，头 {h}，查询词元 {i}「{tok}」（d_k = {d}）",
        "key": "键", "mask": "掩码", "weight": "权重", "share": "占比",
        "win": "（win：-inf，在局部窗口 |j - {i}| <= {w} 之外）",
        "article": "文章（PyTorch）：",
        "split": "x · W_q、x · W_k、x · W_v，切成 {H} 个头，每头 d_k = {d}"
        "（头 {h} 是第 {a}..{b} 列）",
        "eg": "例如 q · k_{j}（「{tok}」）= {v}",
        "rotate": "旋转位置编码：q 和 k 按位置逐对 (i, i + d_k/2) 旋转，角度 = 位置 · θ^(-2i/d_k)，"
        "θ = {theta}",
        "pair0": "q 在位置 {i} 的第 0 对：({a}, {b}) 旋转 {angle} 弧度 -> ({c}, {e})",
        "before": "旋转前 q · k_{j} = {before}，旋转后 {after}：分数现在取决于 {i} - {j}",
        "position": "table[bucket(j - {i}), 头 {h}]（MPNet 的相对位置偏置，各层共用）-> {v}",
        "c2p": "q · Pk[r({i}, j)] / {root}（DeBERTa 的内容到位置项：查询的内容对键 j 相对它的位置，"
        "r = bucket({i} - j)）-> {v}",
        "p2c": "k_j · Pq[r'(j, {i})] / {root}（DeBERTa 的位置到内容项："
        "键 j 的内容对查询相对它的位置，r' = -bucket(j - {i})）-> {v}",
        "maskwin": "局部注意力：|j - {i}| <= {w} 的真实词元为 0，窗口之外和填充位置为 -inf -> {v}",
        "maskpad": "真实词元为 0，填充位置为 -inf -> {v}",
        "masknone": "没有要遮住的键：一段文本（或一对文本）没有填充，{n} 个键全是 0",
        "context": "（|context| = {norm}，权重最大的键「{tok}」占 {share}）",
        "output": "（本头的份额 |share| = {share}，|output| = {norm}）",
        "shared": "分组查询：只有 {kv} 个键/值头，每个由 {g} 个查询头共用："
        "头 {h} 读第 {kvh} 个键/值头（k、v 切成 {kv} 个头，不是 {H} 个）",
        "qknorm": "点积之前，q 和 k 每个头各自在 d_k 上做 RMS 归一化：q / rms(q) · w_q，"
        "k / rms(k) · w_k -> rms(q) = {rms}",
        "scale": "scores · {s}（模型自己的缩放，不是 1/√{d} = {a}）   -> {v}",
    },
}  # fmt: skip
_INDENT = 14  # where a formula line's right side starts: "  scores    = " is 14 wide


@dataclass
class AttentionSteps(PositionSteps):
    """One head's attention for one query token, step by step (the article's order).

    Attributes:
        tokens: the text's tokens; ``query`` indexes them.
        layer, head, query: where the steps were taken.
        x: the query token's input to the layer's attention, ``(E,)``.
        q: its query vector in this head, ``(D,)``; k, v: every token's key and value, ``(L, D)``.
        scores: ``q · k_j`` per key ``(L,)``; scaled: ``scores / sqrt(D)`` (``scores * scale``
            with a scale of the model's own).
        bias: the mask as an additive bias per key (0 = attend, -inf = masked), ``(L,)``.
        weights: ``softmax(scaled + position_bias + c2p + p2c + bias)``, ``(L,)`` (equal to
            the head view's row; the terms a model does not have left out).
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
        c2p, p2c: DeBERTa's disentangled terms per key, ``(L,)``, already scaled
            (:mod:`bertattn.attention.disentangled`): content-to-position ``q · Pk[r(i, j)]``
            and position-to-content ``k_j · Pq[r'(i, j)]``; None for a model without them.
        heads, kv_heads: the layer's query heads and key/value heads (fewer than ``heads``:
            grouped-query, query head h reads key/value head ``h // (heads / kv_heads)``);
            None: one key/value head per query head.
        qk_norm: q and k were RMS-normed per head before the product (``q``, ``k`` and
            ``q_before`` / ``k_before`` are after the norm).
        scale: the scores' factor when it is not ``1 / sqrt(D)`` (DeBERTa's
            ``1 / sqrt(D * (1 + #terms))``, Gemma's ``query_pre_attn_scalar ** -0.5``); None:
            the article's.
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
    heads: int | None = None
    kv_heads: int | None = None
    qk_norm: bool = False
    scale: float | None = None

    @property
    def head_dim(self) -> int:
        return int(self.q.numel())

    def shares(self) -> Tensor:
        """Each key's share of the context: ``|w_j v_j| / sum_i |w_i v_i|``, ``(L,)``."""
        norms = self.weighted_v.norm(dim=-1)
        total = norms.sum()
        return norms / total if total > 0 else norms

    def table(self, lang: str = "en") -> str:
        """One line per key: token, q·k, /sqrt(d), the relative position bias (MPNet only),
        mask, weight, share of the context; ``lang`` ``"en"`` or ``"zh"`` (the page's words)."""
        return steps_table(self, lang)

    def formula(self, lang: str = "en") -> str:
        """The article's formula with this row's numbers filled in (the top key shown), each
        step followed by the article's own PyTorch line(s); ``lang`` as :meth:`table`."""
        return steps_formula(self, lang)


def steps_table(steps: AttentionSteps, lang: str = "en") -> str:
    """One line per key: index, token, q·k, /√d, the relative position bias (MPNet only), mask,
    weight, share of the context; the subword marks explained under it when tokens have them."""
    w = WORDS[check_lang(lang)]
    pos = steps.position_bias
    extra = [(f"+{name}", t) for name, t in _terms(steps) if name != "position"]
    lines = [
        _where(steps, w),
        f"{'#':>4}  {ljust(w['key'], 16)}{'q·k':>10}{_scaled_head(steps):>9}"
        f"{'+pos' if pos is not None else '':>8}{''.join(f'{n:>8}' for n, _ in extra)}"
        f"{rjust(w['mask'], 7)}{rjust(w['weight'], 9)}{rjust(w['share'], 8)}",
    ]
    shares = steps.shares()
    for j, tok in enumerate(steps.tokens):
        mask = "0" if steps.bias[j] == 0 else ("-inf" if steps.bias[j] < -1e30 else "bias")
        if steps.window is not None and abs(j - steps.query) > steps.window:
            mask = "win"  # outside the local window
        rel = f"{float(pos[j]):>8.3f}" if pos is not None else f"{'':>8}"
        rel += "".join(f"{float(t[j]):>8.3f}" for _, t in extra)
        lines.append(
            f"{j:>4}  {ljust(tok, 16, clip_at=15)}{float(steps.scores[j]):>10.3f}"
            f"{float(steps.scaled[j]):>9.3f}{rel}{mask:>7}{float(steps.weights[j]):>9.4f}"
            f"{float(shares[j]):>8.1%}"
        )
    if steps.window is not None:
        lines.append(w["win"].format(i=steps.query, w=steps.window))
    note = subword_note(steps.tokens, lang)
    return "\n".join(lines + ([note] if note else []))


def _terms(steps: AttentionSteps) -> list[tuple[str, torch.Tensor]]:
    """The terms added to the scaled scores before the mask, by name: MPNet's position bias,
    DeBERTa's c2p and p2c (those the model has)."""
    named = (("position", steps.position_bias), ("c2p", steps.c2p), ("p2c", steps.p2c))
    return [(name, t) for name, t in named if t is not None]


def _root(steps: AttentionSteps) -> str:
    """The scores' divisor as the formula writes it: ``√d`` or DeBERTa's ``√(n·d)``."""
    n = 1 + sum(t is not None for t in (steps.c2p, steps.p2c))
    return f"√{steps.head_dim}" if n == 1 else f"√({n}·{steps.head_dim})"


def _scaled_head(steps: AttentionSteps) -> str:
    """The scaled column's title: ``/√d``, ``/√nd`` with DeBERTa's terms, or ``·s`` for a
    model's own scale."""
    n = 1 + sum(t is not None for t in (steps.c2p, steps.p2c))
    if n > 1:
        return f"/√{n}d"
    return "/√d" if steps.scale is None else "·s"


def _where(steps: AttentionSteps, w: dict[str, str]) -> str:
    return w["where"].format(
        l=steps.layer, h=steps.head, i=steps.query, tok=steps.tokens[steps.query], d=steps.head_dim
    )


def _line(name: str, text: str) -> str:
    """A formula line: ``name`` in its column, then ``text`` (``output`` accumulates: +=)."""
    return f"  {name:<9}{'+=' if name == 'output' else ' ='} {text}"


def _article(w: dict[str, str], *steps: str) -> list[str]:
    """The article's own lines of ``steps``, labelled, indented under the formula's line."""
    code = [line for step in steps for line in ARTICLE_CODE[step]]
    pad = " " * (_INDENT + display_width(w["article"]))
    return [" " * _INDENT + w["article"] + code[0], *(pad + line for line in code[1:])]


def _rotation(steps: AttentionSteps, w: dict[str, str], j: int) -> list[str]:
    """The rotation step, for a rotary model: how q and k were turned, one pair shown."""
    if steps.theta is None or steps.q_before is None or steps.k_before is None:
        return []
    d, i = steps.head_dim, steps.query
    angle = i * steps.theta ** (-2 * 0 / d)  # pair 0 turns by the position itself
    pad = " " * _INDENT
    return [
        _line("rotate", w["rotate"].format(theta=f"{steps.theta:g}")),
        pad
        + w["pair0"].format(
            i=i,
            a=f"{float(steps.q_before[0]):.3f}",
            b=f"{float(steps.q_before[d // 2]):.3f}",
            angle=f"{angle:.3f}",
            c=f"{float(steps.q[0]):.3f}",
            e=f"{float(steps.q[d // 2]):.3f}",
        ),
        pad
        + w["before"].format(
            j=j,
            i=i,
            before=f"{float(steps.q_before @ steps.k_before[j]):.3f}",
            after=f"{float(steps.scores[j]):.3f}",
        ),
    ]


def _changes(steps: AttentionSteps, w: dict[str, str]) -> list[str]:
    """The lines of the formula's steps the layer's module changes before the scores: the
    shared key/value heads (grouped-query), the q/k norm."""
    lines = []
    if steps.kv_heads is not None and steps.heads is not None:
        g = steps.heads // steps.kv_heads
        text = w["shared"].format(kv=steps.kv_heads, g=g, h=steps.head, kvh=steps.head // g,
                                  H=steps.heads)  # fmt: skip
        lines.append(_line("k, v", text))
    if steps.qk_norm:
        q = steps.q if steps.q_before is None else steps.q_before  # after the norm
        rms = f"{float(q.pow(2).mean().sqrt()):.3f}"
        lines.append(_line("q/k norm", w["qknorm"].format(rms=rms)))
    return lines


def _scaled(steps: AttentionSteps, w: dict[str, str], j: int) -> str:
    """The scaling's line: the article's ``/ √d``, or the model's own factor."""
    d, v = steps.head_dim, f"{float(steps.scaled[j]):.3f}"
    if steps.c2p is not None or steps.p2c is not None:  # DeBERTa: 1/sqrt((1 + terms) d)
        return _line("scaled", f"scores / {_root(steps)} = scores / {_divisor(steps):.3f}   -> {v}")
    if steps.scale is None:
        return _line("scaled", f"scores / √{d} = scores / {math.sqrt(d):.3f}   -> {v}")
    return _line("scaled", w["scale"].format(s=f"{steps.scale:.4g}", d=d,
                                             a=f"{d ** -0.5:.4g}", v=v))  # fmt: skip


def _mask(steps: AttentionSteps, w: dict[str, str], j: int) -> str:
    """The mask's line: the window's rule, nothing to mask, or padding's -inf."""
    v = f"{float(steps.bias[j]):.0f}"
    if steps.window is not None:
        return _line("mask", w["maskwin"].format(i=steps.query, w=steps.window, v=v))
    if bool((steps.bias == 0).all()):
        return _line("mask", w["masknone"].format(n=len(steps.tokens)))
    return _line("mask", w["maskpad"].format(v=v))


def _divisor(steps: AttentionSteps) -> float:
    """What the scores are divided by: ``sqrt(d)``, or ``1 / scale`` for a model's own."""
    return math.sqrt(steps.head_dim) if steps.scale is None else 1.0 / steps.scale


def _header(steps: AttentionSteps) -> str:
    """The article's formula with this model's change beside it."""
    if steps.c2p is not None or steps.p2c is not None:
        terms = " + ".join(n for n, t in (("c2p", steps.c2p), ("p2c", steps.p2c)) if t is not None)
        n = 1 + len(terms.split(" + "))
        return f"Attention(Q, K, V) = softmax((Q·Kᵀ + {terms}) / √({n}·d_k) + mask) · V"
    pos = "position + " if steps.position_bias is not None else ""
    qk = "norm(Q)·norm(K)ᵀ" if steps.qk_norm else "Q·Kᵀ"
    scale = " / √d_k" if steps.scale is None else " · s"
    return f"Attention(Q, K, V) = softmax({qk}{scale} + {pos}mask) · V"


def steps_formula(steps: AttentionSteps, lang: str = "en") -> str:
    """The article's formula with this row's numbers filled in (the top key shown), each step
    followed by the article's own line(s) for it."""
    w = WORDS[check_lang(lang)]
    d, h, e = steps.head_dim, steps.head, int(steps.x.numel())
    j = int(steps.weights.argmax())
    logits = steps.scaled + steps.bias
    for _, term in _terms(steps):
        logits = logits + term
    exps = torch.exp(logits - logits.max())  # softmax, written out
    total, top = float(exps.sum()), float(exps[j])
    root = _root(steps)
    relative = [
        _line(name, w[name].format(i=steps.query, h=h, root=root, v=f"{float(t[j]):.3f}"))
        for name, t in _terms(steps)
    ]
    split = w["split"].format(H=e // d, d=d, h=h, a=h * d, b=(h + 1) * d - 1)
    eg = w["eg"].format(j=j, tok=steps.tokens[j], v=f"{float(steps.scores[j]):.3f}")
    context = w["context"].format(
        norm=f"{float(steps.context.norm()):.3f}",
        tok=steps.tokens[j],
        share=f"{float(steps.shares()[j]):.1%}",
    )
    output = w["output"].format(
        share=f"{float(steps.output_share.norm()):.3f}", norm=f"{float(steps.output.norm()):.3f}"
    )
    lines = [
        _header(steps),
        _line("q, k, v", split),
        *_article(w, "qkv", "split"),
        *_changes(steps, w),
        *_rotation(steps, w, j),
        _line("scores", f"q · k_j                 {eg}"),
        _scaled(steps, w, j),
        *_article(w, "scaled"),
        *relative,
        _mask(steps, w, j),
        *_article(w, "mask"),
        _line(
            "weights_j",
            f"exp(s_j - max s) / Σ_i exp(s_i - max s) = "
            f"{top:.4f} / {total:.4f} = {float(steps.weights[j]):.4f}",
        ),  # fmt: skip
        *_article(w, "softmax"),
        _line("context", f"Σ_j weights_j · v_j      {context}"),
        *_article(w, "context"),
        _line("output", f"W_o[:, head {h}] · context   {output}"),
        *_article(w, "merge"),
    ]
    return "\n".join(lines)
