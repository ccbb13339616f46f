"""`bertattn predict`: the model's head on every input, as ``bertattn.pipeline`` answers
(options: :class:`bertattn.jobs.options.PredictOptions`)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..jobs.options import PredictOptions, add_arguments

    add_arguments(p, PredictOptions)


def run(args: argparse.Namespace) -> int:
    from ..jobs.heads import run_predict
    from ..jobs.options import PredictOptions, from_namespace
    from . import report

    options = from_namespace(PredictOptions, args)
    report("predict", run_predict(options), quiet=options.quiet)
    return 0
