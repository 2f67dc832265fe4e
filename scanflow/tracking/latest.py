"""The agents' latest monitoring values as Prometheus gauges, beside the MLflow histories.

Every value an agent writes into a service's monitoring run (drift score and p-value, the latency
percentile and the SLO, replicas, the Planner's and Executor's decisions; scanflow.tracking.monitoring)
is also kept here as "the last value seen" and exposed on the agent's `/metrics`, so a Prometheus +
Grafana install sees the same story as the MLflow UI without reading MLflow. Recording happens before
the MLflow write is queued, so the gauges stay current while MLflow is slow or down.

Names: `scanflow_` + the monitoring key with every character outside [a-zA-Z0-9_] turned into `_`
(`drift/score` -> `scanflow_drift_score`, `latency/p99_ms` -> `scanflow_latency_p99_ms`), labelled
with the workflow and the service. One collector per process (agents run one per process; where tests
run several in one process, each agent's `/metrics` shows the values all of them recorded).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "scanflow_"
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(key: str) -> str:
    """Pure: the Prometheus name of a monitoring key (`drift/p_value` -> `scanflow_drift_p_value`)."""
    return PREFIX + _INVALID.sub("_", key).strip("_")


class LatestValues(Collector):
    """The last value recorded per (metric, workflow, service); thread-safe, collected at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, str], float]] = {}

    def record(self, workflow: str, service: str, metrics: Mapping[str, float]) -> None:
        with self._lock:
            for key, value in metrics.items():
                self._values.setdefault(metric_name(key), {})[(workflow, service)] = float(value)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()}
        for name in sorted(snapshot):
            family = GaugeMetricFamily(name, "latest value the agents recorded in the service's monitoring run",
                                       labels=["workflow", "service"])
            for (workflow, service), value in sorted(snapshot[name].items()):
                family.add_metric([workflow, service], value)
            yield family


LATEST = LatestValues()
