"""The server's counters in the Prometheus text format (version 0.0.4), written here: a few
counters, gauges and histograms with labels, thread-safe (the model worker and the event loop
both record)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

__all__ = ["Counter", "Gauge", "Histogram", "Registry"]

#: seconds: 0.5 ms .. 60 s
TIME_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60
)  # fmt: skip
#: texts or tokens per batch
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

Labels = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    return repr(float(x)) if x != int(x) else str(int(x))


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: Sequence[str]) -> Labels:
        key = tuple(str(v) for v in labels)
        if len(key) != len(self.label_names):
            raise ValueError(
                f"{self.name} takes labels {self.label_names}, got {len(key)} values {key}."
            )
        return key

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """A count that only goes up, per label values."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[Labels, float] = {}

    def inc(self, *labels: str, by: float = 1) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + by

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.label_names:
            items = [((), 0)]
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(_Metric):
    """A value read when scraped (``read()``), e.g. the queue's depth."""

    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float]) -> None:
        super().__init__(name, help)
        self.read = read

    def lines(self) -> list[str]:
        return [f"{self.name} {_number(self.read())}"]


class Histogram(_Metric):
    """Observations counted into cumulative buckets (``le``), with their sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets or TIME_BUCKETS))
        self._series: dict[Labels, list[float]] = {}  # counts per bucket + [+Inf, sum]

    def observe(self, value: float, *labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            series = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, edge in enumerate(self.buckets):
                if value <= edge:
                    series[i] += 1
            series[-2] += 1  # +Inf: the count
            series[-1] += value

    def count(self, *labels: str) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return 0 if series is None else int(series[-2])

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        out = []
        for key, series in items:
            for edge, n in zip(self.buckets, series, strict=False):
                le = _labels(self.label_names, key, f'le="{_number(edge)}"')
                out.append(f"{self.name}_bucket{le} {_number(n)}")
            inf = _labels(self.label_names, key, 'le="+Inf"')
            out.append(f"{self.name}_bucket{inf} {_number(series[-2])}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(series[-1])}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {_number(series[-2])}")
        return out


class Registry:
    """The metrics of one server, rendered together by :meth:`render`."""

    def __init__(self) -> None:
        self.metrics: list[_Metric] = []

    def add(self, metric: _Metric) -> _Metric:
        if any(m.name == metric.name for m in self.metrics):
            raise ValueError(f"a metric named {metric.name!r} is already registered.")
        self.metrics.append(metric)
        return metric

    def render(self) -> str:
        """The text exposition format: ``# HELP``, ``# TYPE`` and sample lines per metric."""
        lines: list[str] = []
        for m in self.metrics:
            lines += m.header() + m.lines()
        return "\n".join(lines) + "\n"
