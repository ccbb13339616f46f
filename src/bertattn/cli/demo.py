"""`bertattn demo`: the article's example on every backend."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace) -> int:
    from ..demo import run_article_demo

    demo = run_article_demo()
    print("The article's example: embed_dim=512, num_heads=8, batch_size=2, seq_len=10")
    print(f"input shape:            {demo.input_shape}")
    print(f"output shape:           {demo.output_shape}")
    print(f"attention weight shape: {demo.attention_shape}")
    for c in demo.checks:
        print(
            f"backend={c.requested:<6} ran={c.ran:<6} max|diff vs math|={c.max_abs_diff:.2e}  "
            f"({c.reason})"
        )
    return 0
