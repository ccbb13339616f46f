"""The article's steps for one head and one query token, taken from the real model.

:func:`attention_steps` runs the model once with the ``math`` backend on the asked layer and
keeps that backend's own intermediate values (:mod:`bertattn.attention.steps`), then cuts out
one head and one query row. Shapes (L tokens, D head size, E hidden size)::

    x (E,)  q (D,)  k (L, D)  v (L, D)  scores (L,)  scaled (L,)  bias (L,)  weights (L,)
    weighted_v (L, D)  context (D,)  output_share (E,)  output (E,)
    position_bias (L,) | None: MPNet's relative position bias, its own step (None for BERT)
    q_before (D,) | None, k_before (L, D) | None: before the rotation (rotary models only)
    c2p (L,) | None, p2c (L,) | None: DeBERTa's relative terms, scaled (DeBERTa only)

A head may change the article's formula in its module (:class:`bertattn.MultiHeadAttention`):
``kv_heads`` (grouped-query: fewer key/value heads, each shared by a group of query heads),
``qk_norm`` (q and k RMS-normed per head before the product) and ``scale`` (the scores'
factor when it is not ``1 / sqrt(D)``); the steps say so, each as its own line.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

from ..arguments import ArgumentTypeError, describe, is_int
from ..attention.disentangled import content_scale
from ..attention.steps import record_steps
from ..viz.explain import AttentionSteps

__all__ = ["AttentionSteps", "attention_steps", "find_token", "find_tokens"]


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
    """The article's steps of ``layer`` / ``head`` for the ``query`` token of ``text`` (an
    index or a token's text), from the ``math`` backend's own intermediate values: see
    :class:`AttentionSteps`. This is :meth:`bertattn.Bert.attention_steps` (``bert`` its
    ``self``). ``layer`` / ``head``: ints (NumPy integers too) in the model's range;
    ``query``: a token index (int) or a token's text (str). Anything else raises
    ``TypeError``, a value out of range ``ValueError``, naming the argument."""
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
        _module_changes(steps, bert.model, layer)
        table = bert.model.encoder.relative_table()
        if table is not None:  # MPNet: the relative position bias as its own step
            steps.position_bias = _relative_row(table, len(maps.tokens), head, i)
            steps.bias = steps.bias - steps.position_bias  # the mask alone (exact: see below)
        return steps


def _module_changes(steps: AttentionSteps, model, layer: int) -> None:  # type: ignore[no-untyped-def]
    """What the layer's attention module changes in the article's formula: its key/value
    heads, q/k norm and scale (left as the article's when the layer's module is not found)."""
    from ..attention import MultiHeadAttention

    found = [m for m in model.encoder.modules() if isinstance(m, MultiHeadAttention)]
    if len(found) != model.config.num_hidden_layers:  # one attention a layer, or unknown
        return
    attn = found[layer]
    steps.heads = attn.num_heads
    if attn.num_kv_heads != attn.num_heads:
        steps.kv_heads = attn.num_kv_heads
    steps.qk_norm = "q_norm" in attn._modules
    d = attn.head_dim
    if attn.scale is not None and not math.isclose(attn.scale, d**-0.5, rel_tol=1e-9):
        steps.scale = attn.scale  # the article's 1/sqrt(d) when equal (EmbeddingGemma's 1/16)


def _relative_row(table: Tensor, length: int, head: int, i: int) -> Tensor:
    """MPNet's relative position bias of query ``i`` in ``head``, ``(L,)`` float32: the
    entry the ``math`` backend added (the recorded bias is this plus the mask's 0 / -inf, so
    subtracting it leaves the mask exactly)."""
    from ..blocks.relative import position_bias

    return position_bias(table, length)[0, head, i].to("cpu", torch.float32)


def _kv_head(r, head: int) -> int:  # type: ignore[no-untyped-def]
    """The key/value head query head ``head`` reads: ``head // g`` with grouped-query heads
    (``k_before`` keeps the ``Hkv`` heads the module projected; ``k`` is already repeated)."""
    if r.k_before is None:
        return head
    return head // (r.q.size(1) // r.k_before.size(1))


def _cut(r, tokens: list[str], layer: int, head: int, i: int) -> AttentionSteps:  # type: ignore[no-untyped-def]
    """Head ``head``, query row ``i`` of the record ``r``, in float32 on the CPU."""
    d = r.q.size(-1)
    sl = slice(head * d, (head + 1) * d)
    kv_head = _kv_head(r, head)
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
    c2p, p2c = (None if t is None else t[0, head, i].to("cpu", f32) for t in (r.c2p, r.p2c))
    scaled = r.scaled[0, head, i].to(f32)  # (L,): DeBERTa's terms are in it: taken out
    terms = [t for t in (c2p, p2c) if t is not None]
    for term in terms:
        scaled = scaled - term
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
        scaled=scaled,
        bias=bias,
        weights=weights,
        weighted_v=weights[:, None] * v,
        context=context,
        output_share=w_out[:, sl] @ context,
        output=output,
        q_before=None if r.q_before is None else r.q_before[0, head, i].to("cpu", f32),
        k_before=None if r.k_before is None else r.k_before[0, kv_head].to("cpu", f32),
        theta=r.theta,
        window=r.window,
        c2p=c2p,
        p2c=p2c,
        scale=content_scale(d, len(terms)) if terms else None,
    )
