"""The server's metrics, by name: what ``GET /metrics`` shows (see :mod:`.metrics`)."""

from __future__ import annotations

from collections.abc import Callable

from .metrics import SIZE_BUCKETS, Counter, Gauge, Histogram, Registry

__all__ = ["ServeMetrics"]


class ServeMetrics:
    """Counters and histograms of one server; ``depth()`` -> ``(requests, tokens)`` queued."""

    def __init__(self, depth: Callable[[], tuple[int, int]]) -> None:
        r = self.registry = Registry()
        self.requests = r.add(
            Counter("bertattn_requests_total", "HTTP requests answered", ("route", "status"))
        )
        self.stage = r.add(
            Histogram(
                "bertattn_stage_seconds",
                "time per request in each stage (tokenization, queue, inference, serialization)",
                ("stage",),
            )
        )
        self.batch_texts = r.add(
            Histogram("bertattn_batch_texts", "inputs per model batch", buckets=SIZE_BUCKETS)
        )
        self.batch_tokens = r.add(
            Histogram("bertattn_batch_tokens", "real tokens per model batch", buckets=SIZE_BUCKETS)
        )
        self.batch_seconds = r.add(Histogram("bertattn_batch_seconds", "model time per batch"))
        self.rejections = r.add(
            Counter("bertattn_rejections_total", "requests refused, by reason", ("reason",))
        )
        self.dropped = r.add(
            Counter(
                "bertattn_dropped_inputs_total",
                "admitted inputs dropped before the model ran them (client gone, timed out)",
                ("reason",),
            )
        )
        self.tokens = r.add(Counter("bertattn_tokens_total", "real tokens embedded"))
        #: admitted = computed (bertattn_batch_texts_sum) + dropped, once the queue is empty
        self.admitted_requests = r.add(
            Counter("bertattn_admitted_requests_total", "requests admitted to the queue")
        )
        self.admitted_inputs = r.add(
            Counter("bertattn_admitted_inputs_total", "inputs admitted to the queue")
        )
        self.connections_closed = r.add(
            Counter(
                "bertattn_connections_closed_total",
                "connections the server cut: header_timeout (request headers not complete in "
                "time), idle (nothing sent in time), over_limit (past --max-connections)",
                ("reason",),
            )
        )
        #: HTTP connections open now (kept by the server's protocol, see .connections)
        self.open_connections = 0
        r.add(
            Gauge(
                "bertattn_open_connections", "HTTP connections open", lambda: self.open_connections
            )
        )
        r.add(
            Gauge("bertattn_queue_requests", "requests waiting for the model", lambda: depth()[0])
        )
        r.add(Gauge("bertattn_queue_tokens", "tokens waiting for the model", lambda: depth()[1]))

    def render(self) -> str:
        return self.registry.render()
