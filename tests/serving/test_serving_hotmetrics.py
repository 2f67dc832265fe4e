"""The hot-path collectors expose exactly what prometheus_client's own Counter/Histogram expose (the
Checker and the S2 demo parse the gateway's histogram), minus the `_created` samples."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from scanflow.serving.hotmetrics import HotCounter, HotHistogram
from scanflow.serving.server import LATENCY_BUCKETS


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_histogram_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotHistogram("x_latency_seconds", "doc", LATENCY_BUCKETS, ours)
    ref = Histogram("x_latency_seconds", "doc", registry=theirs, buckets=LATENCY_BUCKETS)
    for v in (0.0001, 0.0005, 0.0007, 0.002, 0.0099, 0.01, 0.3, 2.0, 7.5):  # includes values on a bound
        hot.observe(v)
        ref.observe(v)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))


def test_counter_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hot = HotCounter("x_requests", "doc", ["status", "route"], ours)
    ref = Counter("x_requests", "doc", ["status", "route"], registry=theirs)
    for labels, n in ((("200", "primary"), 3), (("503", "none"), 1), (("200", "primary"), 2)):
        hot.inc(*labels, amount=n)
        ref.labels(*labels).inc(n)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    with pytest.raises(ValueError, match="takes labels"):
        hot.inc("200")
