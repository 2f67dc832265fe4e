"""The Checker's SLO percentile is always a JSON number: past the top bucket it is the largest finite
bound, flagged `above` (it used to be inf, which no event store or peer could take)."""

from __future__ import annotations

import json
import math

from scanflow.agentkit.latency import Percentile, histogram, percentile_ms

INF = math.inf


def test_percentile_in_a_finite_bucket() -> None:
    prev = {0.1: 10.0, 1.0: 10.0, INF: 10.0}
    cur = {0.1: 60.0, 1.0: 109.0, INF: 110.0}  # 100 new: 50 <= 100 ms, 49 <= 1 s, 1 slower
    assert percentile_ms(prev, cur, 0.5) == Percentile(100.0, False)
    assert percentile_ms(prev, cur, 0.99) == Percentile(1000.0, False)


def test_percentile_past_the_top_bucket_is_finite_and_flagged() -> None:
    p = percentile_ms({}, {0.1: 1.0, 1.0: 2.0, INF: 100.0}, 0.99)
    assert p == Percentile(1000.0, True)
    assert p is not None and math.isfinite(p.ms)
    json.dumps({"latency_ms": p.ms, "above_ms": p.above}, allow_nan=False)


def test_no_new_requests_or_no_finite_bucket_gives_none() -> None:
    assert percentile_ms({0.1: 5.0, INF: 5.0}, {0.1: 5.0, INF: 5.0}, 0.99) is None
    assert percentile_ms({}, {INF: 3.0}, 0.5) is None


def test_histogram_reads_prometheus_text() -> None:
    text = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.1"} 3.0\nlat_bucket{le="+Inf"} 4.0\nlat_count 4.0\nlat_sum 2.0\n'
    )
    assert histogram(text, "lat") == {0.1: 3.0, INF: 4.0}
