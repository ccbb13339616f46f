"""The engine contract: what a worker that batches tokenized inputs needs of a model.

A :class:`ModelStep` is one model step, ``encodings -> rows``: sentence embeddings, reranker
or classifier logits, SPLADE rows. It owns what every caller used to repeat: the device,
``torch.inference_mode`` and, on the CPU, the thread governor (:mod:`bertattn.threads`) —
:meth:`ModelStep.session` for a worker's whole life, and each call under the governor's
``batch`` with the batch's real token count. The server's batcher takes a step, never a model,
so it needs nothing of the model's insides.

    step = embedding_step(bert)            # or CrossEncoder.step(), SparseEncoder.step()
    with step.session():
        rows = step(encodings, tokens)     # (B, ...) float32 NumPy rows
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import numpy as np

__all__ = ["ModelStep", "embedding_step"]


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

    def __call__(self, encodings: Sequence[Any], tokens: int) -> np.ndarray:
        """The rows of one batch (``tokens``: its real tokens, for the governor), float32."""
        governor = self.governor
        with governor.batch(tokens) if governor is not None else nullcontext():
            out = self.compute(encodings)
        return out.float().cpu().numpy()


def embedding_step(bert: Any) -> ModelStep:
    """Sentence embeddings, pooled but not normalized (the caller normalizes as asked):
    ``bert.embed_encodings(encodings, normalize=False)``, ``(B, E)``."""
    return ModelStep(bert, lambda enc: bert.embed_encodings(enc, normalize=False), "embed")
