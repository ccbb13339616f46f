"""CUDA graphs for :class:`BertModel` inference: one captured forward per padded shape bucket.

On a GPU a small or medium batch is launch-bound: a BERT-base forward issues a few hundred
kernels, each costing a few microseconds of CPU time to launch, and the GPU finishes each one
before the next arrives. A CUDA graph records those launches once and replays them with one.

A graph replays one fixed shape, reading fixed ("static") input buffers, so batches are padded
up to a bucket::

    input_ids, attention_mask, token_type_ids (B, L)
        --copy into the bucket's static buffers, padded to (Bb, Lb)-->
        --replay: embeddings, every layer (sdpa, mask prepared inside), (Bb, Lb, E)-->
        --[:B, :L], copied out--> last_hidden_state (B, L, E)

Buckets: the length rounds up to a multiple of 16 up to 128, then of 64 (at most the model's
``max_position_embeddings``); the batch rounds up to a power of two. Padding rows and columns
have ``attention_mask`` 0: padded keys get no weight, and a padding row has no key at all, so
its output is zero (the mask's dead-row rule), never NaN.

A bucket is captured the second time it is seen (a one-off shape runs eagerly, as does any call
that cannot be graphed: see :attr:`GraphedBert.last_run`). All graphs share one memory pool:
only one replays at a time and its output is copied out before the next, so their activations
can share memory. Replacing the model's parameters (``to()``, ``load_state_dict(assign=True)``)
drops the graphs; updating them in place is seen by the next replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..attention.backends import get_backend
from ..capture import capturing
from .model import BertModel

__all__ = ["GraphedBert", "bucket_length", "bucket_batch"]

logger = logging.getLogger(__name__)

#: ``capture(fn, device, pool) -> (replay, output)``: run ``fn`` (which reads the static
#: inputs and returns a tensor) so that ``replay()`` later redoes it into ``output``
Capture = Callable[[Callable[[], Tensor], torch.device, object], tuple[Callable[[], None], Tensor]]


def bucket_length(length: int, limit: int) -> int:
    """``length`` rounded up: to a multiple of 16 up to 128, then of 64; at most ``limit``."""
    step = 16 if length <= 128 else 64
    return min(-(-length // step) * step, limit)


def bucket_batch(batch: int) -> int:
    """``batch`` rounded up to a power of two."""
    return 1 << max(batch - 1, 0).bit_length()


def cuda_capture(
    fn: Callable[[], Tensor], device: torch.device, pool: object
) -> tuple[Callable[[], None], Tensor]:
    """Capture ``fn`` into a ``torch.cuda.CUDAGraph`` on ``device`` (after two warm-up runs on
    a side stream, as torch's capture rules ask), sharing the memory ``pool``."""
    with torch.cuda.device(device):  # the model's GPU, whichever is current
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialization (cuBLAS handles, autotuning) happens here
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool), capturing():
            output = fn()

    def replay() -> None:
        with torch.cuda.device(device):
            graph.replay()

    return replay, output


@dataclass
class _Bucket:
    """The static buffers of one captured shape, its replay, and its output."""

    input_ids: Tensor  # (Bb, Lb) long
    attention_mask: Tensor  # (Bb, Lb) long, 0 outside the batch
    token_type_ids: Tensor  # (Bb, Lb) long
    replay: Callable[[], None]
    output: Tensor  # (Bb, Lb, E), written by replay


class GraphedBert:
    """Run a :class:`BertModel` (inference, padded layout) by replaying CUDA graphs.

    Args:
        model: the model; it must stay in eval mode. Its attention backend must work on the
            padded layout (``auto``, ``sdpa``, ``math``): ``varlen`` packs by the mask's values
            and cannot be captured.
        min_uses: capture a bucket on this use of it (earlier uses run eagerly); 1 captures at
            once.
        max_graphs: at most this many buckets are captured; later new buckets run eagerly.
        capture: how a bucket is captured (default :func:`cuda_capture`); the tests pass an
            eager stand-in to check the bucketing on the CPU.

    Calling it returns ``last_hidden_state (B, L, E)``, a new tensor (not a view of a static
    buffer), so it stays valid across later calls. :attr:`last_run` says what ran: ``"graph
    (Bb, Lb)"`` or ``"eager: <why>"``; :attr:`counts` counts captures, replays and eager runs.
    """

    def __init__(
        self,
        model: BertModel,
        *,
        min_uses: int = 2,
        max_graphs: int = 32,
        capture: Capture | None = None,
    ) -> None:
        if not isinstance(model, BertModel):
            raise ValueError(f"model must be a bertattn BertModel, got {type(model).__name__}.")
        from ..families import registry

        registry.require(model.config.family, "cuda_graphs", "GraphedBert")
        if isinstance(min_uses, bool) or not isinstance(min_uses, int) or min_uses < 1:
            raise ValueError(f"min_uses must be an int >= 1, got {min_uses!r}.")
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 0:
            raise ValueError(f"max_graphs must be an int >= 0, got {max_graphs!r}.")
        self.model = model
        self.min_uses = min_uses
        self.max_graphs = max_graphs
        self._capture = capture
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._uses: dict[tuple[int, int], int] = {}
        self._weights: tuple[object, ...] | None = None
        self._pool: object = None
        self.last_run = ""
        self.counts = {"captures": 0, "replays": 0, "eager": 0}

    # ------------------------------------------------------------------ when to graph
    def _weights_signature(self) -> tuple[object, ...]:
        """Where every parameter and buffer lives: a replaced tensor changes it."""
        return tuple(t.data_ptr() for t in self.model.parameters()) + tuple(
            t.data_ptr() for t in self.model.buffers()
        )

    def _why_eager(self, input_ids: Tensor) -> str:
        """Why this call cannot replay a graph ("" when it can)."""
        model = self.model
        if self._capture is None and model.device.type != "cuda":
            return f"CUDA graphs need a CUDA device, the model is on {model.device}"
        if input_ids.device != model.device:
            return f"the inputs are on {input_ids.device}, the model on {model.device}"
        if model.training:
            return "the model is in training mode"
        if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
            return "autograd is recording (run under torch.inference_mode())"
        if model.backend != "auto" and get_backend(model.backend).layout == "packed":
            return f"backend {model.backend!r} packs by the mask's values"
        return ""

    def _bucket_key(self, batch: int, length: int) -> tuple[int, int]:
        limit = self.model.config.max_position_embeddings
        return bucket_batch(batch), bucket_length(length, limit)

    # ------------------------------------------------------------------ capture
    def _new_bucket(self, key: tuple[int, int]) -> _Bucket:
        bb, lb = key
        device = self.model.device
        pad_id = self.model.config.pad_token_id
        ids = torch.full((bb, lb), pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((bb, lb), dtype=torch.long, device=device)
        types = torch.zeros((bb, lb), dtype=torch.long, device=device)
        model = self.model

        def forward() -> Tensor:
            return model(ids, mask, types).last_hidden_state  # (Bb, Lb, E)

        capture = self._capture or cuda_capture
        if self._pool is None and capture is cuda_capture:
            self._pool = torch.cuda.graph_pool_handle()
        replay, output = capture(forward, device, self._pool)
        self.counts["captures"] += 1
        logger.debug("captured a graph for batch %d x length %d on %s", bb, lb, device)
        return _Bucket(ids, mask, types, replay, output)

    def reset(self) -> None:
        """Drop every captured graph (they are captured again when their shapes come back)."""
        self._buckets.clear()
        self._uses.clear()
        self._pool = None

    # ------------------------------------------------------------------ call
    def __call__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``: ``(B, L)``
        on the model's device -> ``last_hidden_state (B, L, E)``."""
        bucket, why = self._plan(input_ids, attention_mask, token_type_ids)
        if bucket is None:  # the model's own checks refuse bad input, with their messages
            self.counts["eager"] += 1
            self.last_run = f"eager: {why}"
            return self.model(input_ids, attention_mask, token_type_ids).last_hidden_state
        b, length = input_ids.shape
        with torch.inference_mode():
            bucket.input_ids.fill_(self.model.config.pad_token_id)
            bucket.input_ids[:b, :length].copy_(input_ids)
            bucket.attention_mask.zero_()
            if attention_mask is None:
                bucket.attention_mask[:b, :length] = 1
            else:
                bucket.attention_mask[:b, :length].copy_(attention_mask)
            bucket.token_type_ids.zero_()
            if token_type_ids is not None:
                bucket.token_type_ids[:b, :length].copy_(token_type_ids)
            bucket.replay()
            out = bucket.output[:b, :length].clone()  # (B, L, E)
        self.counts["replays"] += 1
        self.last_run = f"graph {tuple(bucket.output.shape[:2])}"
        return out

    def _plan(
        self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None
    ) -> tuple[_Bucket | None, str]:
        """The bucket this call replays (captured now if its time has come), or None and why
        the call runs eagerly."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            return None, "input_ids is not a (batch, seq_len) tensor"
        b, length = input_ids.shape
        if any(t is not None and t.shape != (b, length) for t in (attention_mask, token_type_ids)):
            return None, "the mask or token types do not match input_ids"
        why = self._why_eager(input_ids)
        if why:
            return None, why
        if length > self.model.config.max_position_embeddings:
            return None, "longer than max_position_embeddings"  # the model's error follows
        weights = self._weights_signature()
        if weights != self._weights:
            if self._buckets:
                logger.info("the model's tensors were replaced: dropping its CUDA graphs")
            self.reset()
            self._weights = weights
        key = self._bucket_key(b, length)
        bucket = self._buckets.get(key)
        if bucket is not None:
            return bucket, ""
        uses = self._uses.get(key, 0) + 1
        self._uses[key] = uses
        if uses < self.min_uses:
            return None, f"first use of bucket {key} (captured on use {self.min_uses})"
        if len(self._buckets) >= self.max_graphs:
            return None, f"{self.max_graphs} graphs captured already (max_graphs)"
        with torch.inference_mode():
            bucket = self._new_bucket(key)
        self._buckets[key] = bucket
        return bucket, ""
