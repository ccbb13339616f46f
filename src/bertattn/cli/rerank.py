"""`bertattn rerank`: documents ranked for a query (options: :class:`~bertattn.jobs.options.
RerankOptions`)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.options import RerankOptions, add_arguments

    add_arguments(p, RerankOptions)


def run(args: argparse.Namespace) -> int:
    from ..jobs.heads import run_rerank
    from ..jobs.options import RerankOptions, from_namespace
    from . import report

    options = from_namespace(RerankOptions, args)
    report("rerank", run_rerank(options), quiet=options.quiet)
    return 0
