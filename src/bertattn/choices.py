"""Names that both the library and the command line accept, defined once.

The library checks them where a call comes in; the jobs' options (``bertattn.jobs.*_options``)
offer them as ``choices`` and check them on construction. They live here, in a module that
imports nothing, so that the command line reads them without importing torch (which
:mod:`bertattn.encoder` and :mod:`bertattn.heads` do)."""

from __future__ import annotations

__all__ = ["AGGREGATIONS", "FUNCTIONS", "POOLINGS"]

#: sentence-embedding poolings (``Bert(pooling=...)``, ``--pooling``)
POOLINGS = ("mean", "cls", "max", "lasttoken")
#: what a classifier applies to its logits (``function_to_apply``, ``--function-to-apply``)
FUNCTIONS = ("sigmoid", "softmax", "none")
#: how a token classifier groups its tokens (``aggregation_strategy``, ``--aggregation-strategy``)
AGGREGATIONS = ("none", "simple", "first", "average", "max")
