"""`bertattn attend`: one text in, its attention out (summary, PNG, HTML page, JSON)."""

from __future__ import annotations

import argparse
import sys
import warnings


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the text to look at")
    p.add_argument("--pair", default=None, help="a second text (segment B of a pair)")
    p.add_argument("--model", default=None, help="model folder or hub name (default MiniLM)")
    p.add_argument("--layer", type=int, default=0, help="layer shown large / summarized")
    p.add_argument("--head", type=int, default=0, help="head shown large / summarized")
    p.add_argument("--png", default=None, help="write a PNG: every layer x head + one large")
    p.add_argument("--html", default=None, help="write one self-contained interactive page")
    p.add_argument("--json", default=None, help="write the tokens and weights as JSON")
    p.add_argument("--rollout", action="store_true", help="add attention rollout to outputs")


def _check_range(what: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise ValueError(
            f"--{what} {value} is out of range: this model has {what}s 0..{count - 1}."
        )


def run(args: argparse.Namespace) -> int:
    from .. import viz
    from ..bert import Bert

    if not args.text.strip():
        raise ValueError("TEXT is empty; give the sentence whose attention you want to see.")
    if args.pair is not None and not args.pair.strip():
        raise ValueError("--pair is empty; drop it or give a second sentence.")
    bert = Bert.load(args.model)
    cfg = bert.model.config
    _check_range("layer", args.layer, cfg.num_hidden_layers)
    _check_range("head", args.head, cfg.num_attention_heads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        maps = bert.attention_maps(args.text, args.pair)
    for w in caught:  # e.g. "1 text truncated to 256 tokens": reported, not silent
        print(f"bertattn attend: warning: {w.message}", file=sys.stderr)
    outputs = (args.png, args.html, args.json)
    if not any(outputs):
        print(viz.summary(maps, layer=args.layer, head=args.head))
        if args.rollout:
            roll = viz.attention_rollout(maps)
            print("\nrollout: most attended input token per token")
            for i, tok in enumerate(maps.tokens):
                j = int(roll[i].argmax())
                print(f"  {i:>4} {tok:<16} -> {maps.tokens[j]} ({roll[i, j]:.3f})")
        return 0
    written = viz.render_all(
        maps,
        png=args.png,
        html=args.html,
        json_path=args.json,
        layer=args.layer,
        head=args.head,
        rollout=args.rollout,
    )
    print(
        f"{len(maps.tokens)} tokens, {maps.num_layers} layers x {maps.num_heads} heads "
        f"({maps.model_name})"
    )
    for path in written:
        print(f"wrote {path.resolve()}")
    return 0
