"""``Bert.load(compile=True)``: the encoder's forward through ``torch.compile``.

One inductor graph with dynamic batch and sequence sizes (``dynamic=True``, so no recompile per
length; batch size 1 gets one graph of its own, as torch specializes sizes 0 and 1), weights
frozen into it as constants (inductor's ``freezing``: constant folding and weight prepacking
for the CPU's matrix products). The traced forward never packs a batch (``varlen`` is
data-dependent): a padded batch runs the fused ``sdpa`` kernel, as ``encode``'s length-sorted
batches pad little.

It is opt-in and never a default: on the CPUs it was measured on it was not faster than the
eager path (see docs/performance.md). When it cannot run, the model stays eager and a warning
says why, in words a user can act on: a family or a dtype it does not take, no C++ compiler
(inductor's CPU backend builds C++), a compile that failed (its real cause, from
:mod:`bertattn.encoder.compile_errors`), or a compiled graph that disagrees with the eager one on
a probe batch (it is checked there, relative to the eager output's size, before it is used).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..families import registry as families
from .compile_errors import explain_failure

if TYPE_CHECKING:
    from .model import BertModel
    from .pipeline import Bert

__all__ = ["PROBE_TEXTS", "TOLERANCE", "CompileChoice", "CompiledForward", "compile_bert"]

log = logging.getLogger("bertattn")

#: texts of unequal lengths (a padded batch) the compiled graph is built on and checked with
PROBE_TEXTS = (
    "A short probe.",
    "The compiled encoder gives the eager encoder's states, padding and all.",
)

#: largest allowed ``max |compiled - eager|`` over the real tokens, relative to
#: ``max |eager|`` there (float32 products reassociated by inductor differ by ~1e-6)
TOLERANCE = 1e-4


@dataclass(frozen=True)
class CompileChoice:
    """Whether :meth:`Bert.load` ``(compile=True)`` left a compiled forward in place.

    Attributes:
        active: the compiled graph runs ``encode``'s batches.
        reason: why (or why not), for logs, ``explain`` and the CLI's ``-v``.
        seconds: time spent compiling and checking (0 when nothing was compiled).
    """

    active: bool
    reason: str
    seconds: float = 0.0

    def __str__(self) -> str:
        return self.reason


class CompiledForward:
    """``(ids (B, L), mask (B, L), types (B, L)) -> hidden (B, L, E)`` through one compiled
    graph of ``model`` (kept for the compiled function's lifetime)."""

    def __init__(self, model: BertModel) -> None:
        self.model = model
        self._fn = torch.compile(model, dynamic=True, fullgraph=True, options={"freezing": True})

    def __call__(self, ids: Tensor, mask: Tensor, types: Tensor) -> Tensor:
        return self._fn(ids, mask, types).last_hidden_state


def _not_taken(bert: Bert) -> str | None:
    """Why ``bert`` cannot be compiled, before any work (None: it can)."""
    model = bert.model
    if bert.precision == "int8":
        return "dtype='int8' compiles its own fused kernels; load in float32 or bfloat16"
    family = families.get(model.config.family)
    if not family.can("compile"):
        return f"{family.title}: {families.CAPABILITIES['compile']} is not taken for " + (
            family.why_not("compile")
        )
    if model.device.type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as exc:  # InvalidCxxCompiler, or no compiler program on PATH
            return (
                f"inductor's CPU backend needs a C++ compiler and none was found "
                f"({type(exc).__name__}: {exc}); install g++ or clang++"
            )
    return None


def _check(model: BertModel, compiled: CompiledForward, bert: Bert) -> float:
    """Build the graph on :data:`PROBE_TEXTS` and return its error relative to eager."""
    device = model.device
    with warnings.catch_warnings():  # a small vocabulary may cut the probe: no matter
        warnings.filterwarnings("ignore", message=".*were truncated")
        encodings = bert.tokenizer.encode_batch(list(PROBE_TEXTS), max_length=32)
    batch = bert.tokenizer.pad(encodings)
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    types = batch.token_type_ids.to(device)
    with torch.inference_mode():
        want = model(ids, mask, types).last_hidden_state.float()
        got = compiled(ids, mask, types).float()
    real = mask.bool()
    scale = float(want[real].abs().max()) or 1.0
    return float((got[real] - want[real]).abs().max()) / scale


def compile_bert(bert: Bert) -> CompileChoice:
    """Compile ``bert``'s forward in place (``bert.compiled``) and return the choice; on any
    obstacle warn, leave the eager forward, and say why in the returned choice."""
    why = _not_taken(bert)
    if why is not None:
        reason = f"compile=True did not run: {why}; encoding eagerly."
        warnings.warn(reason, stacklevel=3)
        return CompileChoice(False, reason)
    start = time.perf_counter()
    model = bert.model
    compiled = CompiledForward(model)
    try:
        error = _check(model, compiled, bert)
    except Exception as exc:
        torch._dynamo.reset()
        reason = explain_failure(
            exc,
            what="compile=True",
            kernels="the encoder's graph",
            call="the compiled forward",
            instead="leave compile off (the eager encoder gives the same vectors)",
        )
        warnings.warn(reason + " Encoding eagerly.", stacklevel=3)
        return CompileChoice(False, reason + " Encoding eagerly.")
    seconds = time.perf_counter() - start
    if not error <= TOLERANCE:
        reason = (
            f"compile=True did not run: the compiled graph differs from the eager encoder by "
            f"{error:.2e} (relative) on a probe batch, more than {TOLERANCE:.0e}; encoding "
            f"eagerly. Please report it with your torch version ({torch.__version__})."
        )
        warnings.warn(reason, stacklevel=3)
        return CompileChoice(False, reason, seconds)
    bert.compiled = compiled
    reason = (
        f"compiled with torch.compile (inductor, frozen weights, dynamic shapes) in "
        f"{seconds:.1f} s; probe batch within {error:.1e} of eager (relative)"
    )
    log.info("%s: %s", bert.name or "model", reason)
    return CompileChoice(True, reason, seconds)
