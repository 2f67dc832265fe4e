"""Prometheus counters and histograms cheap enough for the per-request hot path.

Why: prometheus_client's `Histogram.observe` walks its buckets in Python under a mutex and
`Counter.inc` takes a mutex too: ~3-10 us per request on this machine, 10-15% of the gateway's whole
per-request CPU (profiled under wrk, docs/serving.md). These keep plain ints, bisect the bucket, and
build the families only when /metrics is scraped. The exposition is the same as prometheus_client's
(`<name>_total{...}`, `<name>_bucket{le=...}`, `_count`, `_sum`), so the Checker and the S2 demo
parse it unchanged (no `_created` samples: nothing reads them).

Not thread-safe by design: the hot paths update them from the event loop thread only, and a scrape
runs on that same loop. Who calls: scanflow.serving.gateway and scanflow.serving.replica.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class HotCounter(Collector):
    """A counter with labels; `inc(*label_values, amount=1)`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def inc(self, *labels: str, amount: float = 1) -> None:
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labels}")
        self.values[labels] = self.values.get(labels, 0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in list(self.values.items()):
            family.add_metric(labels, value)
        yield family


class HotHistogram(Collector):
    """A histogram without labels; `observe(value)`."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        self.name = name
        self.documentation = documentation
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative (made cumulative on scrape)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation)
        cumulative, running = [], 0
        for bound, n in zip(self.bounds, list(self.counts), strict=True):
            running += n
            cumulative.append((_le(bound), running))
        family.add_metric([], cumulative, self.sum)
        yield family


def _le(bound: float) -> str:
    """The `le` label as prometheus_client writes it (0.5 -> "0.5", 1 -> "1.0", inf -> "+Inf")."""
    return "+Inf" if bound == float("inf") else repr(float(bound))
