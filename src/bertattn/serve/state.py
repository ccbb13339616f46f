"""What the routes share (:class:`ServeState`): one model's kind, limits, batcher, metrics,
tokenizer thread and drain state. Below the routes: they import it, it imports none of them."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..serve_defaults import check_model_length
from .batcher import Batcher
from .errors import ApiError
from .limits import Limits
from .served import model_names, serve_model
from .telemetry import ServeMetrics

__all__ = ["ServeState"]

#: requests with at most this many characters of text are tokenized on the event loop (tens of
#: microseconds: less than handing them to the tokenizer thread and waking the loop again)
_INLINE_CHARS = 4096
#: a large request is tokenized in chunks of at most this many texts / characters, the lock given
#: up between chunks, so that a small request waits for one chunk, not the whole request
_CHUNK_TEXTS = 256
_CHUNK_CHARS = 64 << 10


class ServeState:
    """What the routes share: the model, the limits, the batcher, the metrics, and whether the
    server is ready (not draining, its worker alive). ``in_flight``: data requests being
    answered."""

    def __init__(self, model: Any, limits: Limits, metrics: ServeMetrics | None = None) -> None:
        #: the model's kind, its routes and its engine step (:mod:`.served`)
        self.served = serve_model(model)
        bert = self.bert = self.served.bert  # the encoder: tokenizer, limits, device
        self.limits = limits
        limit = check_model_length(
            limits.max_input_tokens, limits.max_batch_tokens, int(bert.max_length)
        )
        self.max_input_tokens = limit
        self.width = int(bert.get_embedding_dimension())
        self.vocab = int(bert.model.config.vocab_size)
        aliases = model_names(str(bert.name or "bertattn"))
        first = () if limits.served_name is None else (limits.served_name,)
        self.names = tuple(dict.fromkeys((*first, *aliases, *limits.names)))
        #: one server's counters (several models share one: ``metrics``)
        self.metrics = metrics or ServeMetrics(lambda: self.batcher.depth())
        self.batcher = Batcher(
            self.served.step,
            max_batch_tokens=limits.max_batch_tokens,
            max_queue_tokens=limits.max_queue_tokens,
            max_wait_s=limits.max_wait_s,
            max_queue_s=limits.max_queue_s,
            min_queue_requests=limits.min_queue_requests,
            metrics=self.metrics,
        )
        self.tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="bertattn-tokenize")
        #: held while the tokenizer runs: its truncation length is state, one caller at a time
        self.tokenizer_lock = threading.Lock()
        self.draining = False
        self.in_flight = 0
        self.started = time.time()
        self.stop_timeout: float | None = None  # the lifespan's end waits this long for the worker

    @property
    def ready(self) -> bool:
        return not self.draining and self.batcher.failed is None

    def drain(self) -> None:
        """Stop taking data requests (503) and say so on ``/ready``; in-flight ones finish."""
        self.draining = True

    async def tokenize(self, fn: Callable[..., Any], texts: list[str], *args: Any) -> Any:
        """``fn(bert, texts, *args)`` under the tokenizer lock: on the event loop for a small
        request when the lock is free, else on the tokenizer thread (a large request never
        holds up the loop) in chunks of at most ``_CHUNK_TEXTS`` texts / ``_CHUNK_CHARS``
        characters, one at a time, so that other requests' chunks run in between (one request
        does not hold the tokenizer for the others). ``fn`` returns a list, or a tuple of
        lists, per text; a 400 naming ``param[i]`` names the index in the whole request. Its
        time goes to the histogram."""
        start = time.perf_counter()
        try:
            if sum(map(_size, texts)) <= _INLINE_CHARS and self.tokenizer_lock.acquire(False):
                try:
                    return fn(self.bert, texts, *args)
                finally:
                    self.tokenizer_lock.release()
            loop = asyncio.get_running_loop()
            out: Any = None
            for first, chunk in _chunks(texts):
                try:
                    part = await loop.run_in_executor(
                        self.tokenizer_thread, self._locked, fn, chunk, *args
                    )
                except ApiError as exc:
                    raise _shifted(exc, first) from None
                if out is None:
                    out = part
                elif isinstance(out, tuple):
                    for whole, piece in zip(out, part, strict=True):
                        whole.extend(piece)
                else:
                    out.extend(part)
            return out
        finally:
            self.metrics.stage.observe(time.perf_counter() - start, "tokenization")

    def _locked(self, fn: Callable[..., Any], texts: list[str], *args: Any) -> Any:
        with self.tokenizer_lock:
            return fn(self.bert, texts, *args)


def _size(text: str | tuple[str, ...]) -> int:
    """Characters of a text, or of a pair's texts together."""
    return len(text) if isinstance(text, str) else sum(map(len, text))


def _chunks(texts: list[str]) -> Iterator[tuple[int, list[str]]]:
    """``(index of the first, texts)`` of consecutive chunks of at most ``_CHUNK_TEXTS`` texts
    and ``_CHUNK_CHARS`` characters (a longer single text is a chunk by itself)."""
    start = chars = 0
    for i, text in enumerate(texts):
        if i > start and (i - start >= _CHUNK_TEXTS or chars + _size(text) > _CHUNK_CHARS):
            yield start, texts[start:i]
            start, chars = i, 0
        chars += _size(text)
    yield start, texts[start:]


def _shifted(exc: ApiError, by: int) -> ApiError:
    """``exc`` naming ``param[i]`` of a chunk as ``param[i + by]`` of the whole request."""
    match = None if exc.param is None else re.fullmatch(r"(.*)\[(\d+)\]", exc.param)
    if by and match:
        where = f"{match[1]}[{int(match[2]) + by}]"
        exc.message = exc.message.replace(f"'{exc.param}'", f"'{where}'")
        exc.param = where
    return exc
