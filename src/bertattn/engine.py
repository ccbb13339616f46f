"""The engine contract: what a worker that batches tokenized inputs needs of a model.

A :class:`ModelStep` is one model step, ``encodings -> rows``: sentence embeddings, reranker
or classifier logits, SPLADE rows. It owns what every caller used to repeat: the device,
``torch.inference_mode`` and, on the CPU, the thread governor (:mod:`bertattn.runtime.threads`) —
:meth:`ModelStep.session` for a worker's whole life, and each call under the governor's
``batch`` with the batch's real token count (:meth:`ModelStep.timed`). Every model run goes
through one: ``Bert.encode`` (and so the encode jobs, single, chunked and distributed), the
heads (``CrossEncoder``, ``SparseEncoder``, the pipelines and their jobs) and the server's
batcher, which takes a step, never a model, so it needs nothing of the model's insides.

    step = embedding_step(bert)            # or CrossEncoder.step(), SparseEncoder.step()
    with step.session():
        rows = step(encodings, tokens)     # (B, ...) float32 NumPy rows
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import numpy as np

__all__ = ["ModelStep", "TurnTaking", "WrappedStep", "embedding_step"]


class ModelStep:
    """``compute(encodings) -> (B, ...) tensor`` of ``bert`` (a :class:`bertattn.Bert` or
    anything with ``device`` and ``governor``), run as the contract says (module docstring).
    ``kind``: what the rows are (``"embed"``, ``"scores"``, ``"sparse"``)."""

    def __init__(self, bert: Any, compute: Callable[[Sequence[Any]], Any], kind: str) -> None:
        self.bert = bert
        self.compute = compute
        self.kind = kind

    @property
    def governor(self) -> Any:
        """The thread governor when the model runs on the CPU with one, else None."""
        device = getattr(self.bert, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            return None
        return getattr(self.bert, "governor", None)

    @contextmanager
    def session(self) -> Iterator[None]:
        """Held while a worker runs batches: inference mode, the governor's loop."""
        import torch

        with ExitStack() as stack:
            governor = self.governor
            if governor is not None:
                stack.enter_context(governor.loop())
            stack.enter_context(torch.inference_mode())
            yield

    @contextmanager
    def timed(self, tokens: int) -> Iterator[None]:
        """One batch of ``tokens`` real tokens, inside :meth:`session`: the governor times it
        (and may change the threads between batches); nothing without a governor. A batch that
        balances its own load (``model.balances_load``: more row chunks than chunk workers) runs
        at the governor's full count instead."""
        governor = self.governor
        if governor is None:
            yield
            return
        balances = getattr(getattr(self.bert, "model", None), "balances_load", None)
        balanced = callable(balances) and balances(tokens, governor.rungs[0])
        # the keyword only when it applies: a governor-like object without it keeps working
        with governor.batch(tokens, balanced=True) if balanced else governor.batch(tokens):
            yield

    def __call__(self, encodings: Sequence[Any], tokens: int) -> np.ndarray:
        """The rows of one batch (``tokens``: its real tokens, for the governor), float32."""
        with self.timed(tokens):
            out = self.compute(encodings)
        return out.float().cpu().numpy()


def embedding_step(bert: Any) -> ModelStep:
    """Sentence embeddings, pooled but not normalized (the caller normalizes as asked):
    ``bert.embed_encodings(encodings, normalize=False)``, ``(B, E)``."""
    return ModelStep(bert, lambda enc: bert.embed_encodings(enc, normalize=False), "embed")


class TurnTaking:
    """A lock that serves threads in the order they asked (first come, first served; a plain
    lock lets the thread that just released it take it again, so a thread that loops could
    starve the others). The steps of a multi-model server with one worker for all share one
    (:meth:`share`): one batch at a time across them; a tokenizer holds one around its
    encodes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the ticket the next caller gets
        self._serving = 0  # the ticket whose turn it is

    def __getstate__(self) -> dict[str, object]:
        return {}  # a copy is a turn of its own, nobody waiting (a Condition is not copied)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    def __enter__(self) -> None:
        with self._cond:
            ticket = self._next
            self._next += 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    def share(self, step: ModelStep) -> ModelStep:
        """``step``, its batches run in turn with the other steps this object shares."""
        return _InTurn(step, self)


class WrappedStep(ModelStep):
    """Another step's batches, each run inside :meth:`around` (nothing, here): the base of
    steps that add something to every batch (a turn, a delay). The session is the inner
    step's."""

    def __init__(self, step: ModelStep) -> None:
        super().__init__(step.bert, step.compute, step.kind)
        self._step = step

    def around(self) -> AbstractContextManager[object]:
        """What each batch runs inside."""
        return nullcontext()

    @contextmanager
    def session(self) -> Iterator[None]:
        with self._step.session():
            yield

    def __call__(self, encodings: Sequence[Any], tokens: int) -> np.ndarray:
        with self.around():
            return self._step(encodings, tokens)


class _InTurn(WrappedStep):
    """A step whose batches wait for their turn (:class:`TurnTaking`)."""

    def __init__(self, step: ModelStep, turns: TurnTaking) -> None:
        super().__init__(step)
        self._turns = turns

    def around(self) -> AbstractContextManager[object]:
        return self._turns
