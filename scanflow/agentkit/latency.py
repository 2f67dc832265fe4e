"""Pure: a latency percentile from two snapshots of a cumulative Prometheus histogram.

Why its own module: the Checker's `watch` sensor judges the SLO with it, and the answer must always be
a JSON number. A percentile that falls in the top (+Inf) bucket is only known to be above the largest
finite bound, so it is reported as that bound with `above=True` (never `inf`, which JSON cannot carry:
an event holding it could not be stored or forwarded to the Planner).
Who calls: scanflow/standard/checker.py; tests.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Percentile(NamedTuple):
    ms: float  # the bucket's upper bound, in milliseconds; a lower bound when `above`
    above: bool  # True: the percentile is in the +Inf bucket, so the latency is at least `ms`


def percentile_ms(prev: dict[float, float], cur: dict[float, float], q: float) -> Percentile | None:
    """The q-quantile of the requests completed between two cumulative snapshots ({le: count}, le in
    seconds), or None when none completed (or the histogram has no finite bucket to report)."""
    les = sorted(cur)
    diffs = [(le, cur[le] - prev.get(le, 0.0)) for le in les]
    total = diffs[-1][1] if diffs else 0.0
    if total <= 0:
        return None
    finite = [le for le in les if math.isfinite(le)]
    for le, c in diffs:
        if c >= q * total:
            if math.isfinite(le):
                return Percentile(le * 1000.0, False)
            return Percentile(finite[-1] * 1000.0, True) if finite else None
    return None


def histogram(text: str, name: str) -> dict[float, float]:
    """The cumulative buckets {le: count} of histogram `name` in Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == f"{name}_bucket":
                out[float(s.labels["le"])] = float(s.value)
    return out
