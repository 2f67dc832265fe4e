"""The agents' monitoring values on their `/metrics`, by Prometheus' conventions, beside the MLflow histories.

Every value an agent writes into a service's monitoring run (drift score and p-value, the SLO,
replicas, the Planner's and Executor's decisions; scanflow.tracking.monitoring) is also exposed on the
agent's `/metrics`, so a Prometheus + Grafana install sees the same story as the MLflow UI without
reading MLflow. Recording happens before the MLflow write is queued, so the metrics stay current while
MLflow is slow or down. Three kinds, each labelled with the workflow and the service:

- a level (the last value seen) is a gauge: `scanflow_` + the key with every character outside
  [a-zA-Z0-9_] turned into `_` (`drift/score` -> `scanflow_drift_score`);
- an event flag (EVENT_KEYS: 1 when the check or decision found it) is a counter of the times it
  happened, `..._total` (`plan/retrain` -> `scanflow_plan_retrain_total`): a 0/1 gauge would be
  missed by a scrape that falls between two decisions;
- a duration is in seconds (`latency/slo_ms` -> `scanflow_latency_slo_seconds`, the value / 1000).
  A latency percentile the Checker computed (`latency/p99_ms`) is left out: Prometheus computes any
  percentile from the gateway's histogram (`scanflow_gateway_request_latency_seconds`).

One collector per process (agents run one per process; where tests run several in one process, each
agent's `/metrics` shows the values all of them recorded).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "scanflow_"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
_PERCENTILE = re.compile(r"/p[0-9.]+_ms$")
# the flags the standard agents write once per check or decision (scanflow.tracking.monitoring and
# scanflow/standard/): 1 when it happened
EVENT_KEYS = frozenset({"drift/flag", "latency/breached", "plan/retrain", "plan/route_changed", "action/promoted"})


def metric_name(key: str) -> str | None:
    """Pure: the Prometheus name of a monitoring key (`drift/p_value` -> `scanflow_drift_p_value`,
    `plan/retrain` -> `scanflow_plan_retrain_total`, `latency/slo_ms` -> `scanflow_latency_slo_seconds`),
    or None for a key not exported (a precomputed percentile)."""
    if _PERCENTILE.search(key):
        return None
    base = PREFIX + _INVALID.sub("_", key).strip("_")
    if key in EVENT_KEYS:
        return base + "_total"
    return base[: -len("_ms")] + "_seconds" if base.endswith("_ms") else base


class LatestValues(Collector):
    """Per (metric, workflow, service): the last value of a level, the running count of an event;
    thread-safe, collected at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._levels: dict[str, dict[tuple[str, str], float]] = {}
        self._events: dict[str, dict[tuple[str, str], float]] = {}

    def record(self, workflow: str, service: str, metrics: Mapping[str, float]) -> None:
        with self._lock:
            for key, value in metrics.items():
                name = metric_name(key)
                if name is None:
                    continue
                if key in EVENT_KEYS:
                    series = self._events.setdefault(name, {})
                    series[(workflow, service)] = series.get((workflow, service), 0.0) + float(bool(value))
                else:
                    scale = 1e-3 if key.endswith("_ms") else 1.0
                    self._levels.setdefault(name, {})[(workflow, service)] = float(value) * scale

    def clear(self) -> None:
        with self._lock:
            self._levels.clear()
            self._events.clear()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self._lock:
            levels = {name: dict(series) for name, series in self._levels.items()}
            events = {name: dict(series) for name, series in self._events.items()}
        for name in sorted(levels):
            gauge = GaugeMetricFamily(name, "latest value the agents recorded in the service's monitoring run",
                                      labels=["workflow", "service"])
            for (workflow, service), value in sorted(levels[name].items()):
                gauge.add_metric([workflow, service], value)
            yield gauge
        for name in sorted(events):
            counter = CounterMetricFamily(name, "times the agents recorded this event for the service",
                                          labels=["workflow", "service"])
            for (workflow, service), value in sorted(events[name].items()):
                counter.add_metric([workflow, service], value)
            yield counter


LATEST = LatestValues()
