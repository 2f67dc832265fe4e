"""Pure: what the Checker observes of a service over one interval, from two scrapes of its /metrics.

Why its own module: the Planner's scaling and resources policies read only these observations (no
oracle rates, no machine model), and the scaling benchmark simulates exactly them; one definition
keeps the three in step. Inputs are Prometheus text expositions: the gateway's (request counters,
latency histogram, in-flight gauge) and each replica's (process CPU seconds, CPU limit, cgroup
throttling, node idle seconds, requests, model time; scanflow.serving.cpustat). Counters become rates
over the interval (delta / dt); a counter that went backwards (a restarted replica) gives no rate for
that replica this tick rather than a negative one.

Who calls: scanflow/standard/checker.py (`watch`); tests; benchmarks/scaling.py documents the same fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GatewaySample:
    completed: float  # requests answered (all statuses)
    latency_sum_s: float
    latency_count: float
    outstanding: float


@dataclass(frozen=True)
class ReplicaSample:
    at: float | None  # the replica's clock at the scrape (None: not exported)
    cpu_s: float | None
    limit_cores: float | None
    periods: float | None
    throttled_periods: float | None
    requests: float | None
    model_s: float | None
    threads: float | None
    node_cpus: float | None
    node_idle_s: float | None
    node: str | None = None  # the node's id (its kernel boot id): replicas with the same one share its cores


def _samples(text: str) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """({sample name: value} with labelled samples summed over their labels, {name: last labels})."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
            if s.labels:
                labels[s.name] = dict(s.labels)
    return out, labels


def parse_gateway(text: str) -> GatewaySample | None:
    """The gateway's counters, or None when the text holds none of them."""
    s, _ = _samples(text)
    if "scanflow_gateway_request_latency_seconds_count" not in s:
        return None
    return GatewaySample(
        completed=s.get("scanflow_gateway_requests_total", 0.0),
        latency_sum_s=s.get("scanflow_gateway_request_latency_seconds_sum", 0.0),
        latency_count=s["scanflow_gateway_request_latency_seconds_count"],
        outstanding=s.get("scanflow_gateway_outstanding", 0.0),
    )


def parse_replica(text: str) -> ReplicaSample:
    s, labels = _samples(text)
    return ReplicaSample(
        at=s.get("scanflow_replica_scrape_time_seconds"),
        cpu_s=s.get("scanflow_replica_cpu_seconds_total"),
        limit_cores=s.get("scanflow_replica_cpu_limit_cores"),
        periods=s.get("scanflow_replica_cpu_periods_total"),
        throttled_periods=s.get("scanflow_replica_cpu_throttled_periods_total"),
        # counters that start at zero: a replica that served nothing yet exports the family without samples
        requests=s.get("scanflow_replica_requests_total", 0.0),
        model_s=s.get("scanflow_replica_model_call_seconds_sum", 0.0),
        threads=s.get("scanflow_replica_threads"),
        node_cpus=s.get("scanflow_replica_node_cpus"),
        node_idle_s=s.get("scanflow_replica_node_cpu_idle_seconds_total"),
        node=labels.get("scanflow_replica_node_info", {}).get("node"),
    )


def _delta(cur: float | None, prev: float | None) -> float | None:
    if cur is None or prev is None or cur < prev:
        return None
    return cur - prev


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def window(prev_gw: GatewaySample | None, cur_gw: GatewaySample | None,
           prev_reps: dict[str, ReplicaSample], cur_reps: dict[str, ReplicaSample], dt: float) -> dict[str, Any]:
    """The observation fields of `latency.checked` over the interval `dt` (seconds, the Checker's clock).

    Each field is None when it cannot be measured this tick (first scrape, no request answered,
    a replica that did not answer or restarted). See docs/policies.md for what each one means.
    """
    out: dict[str, Any] = {
        "interval_s": _round(dt, 3), "arrival_rate": None, "completion_rate": None, "mean_latency_ms": None,
        "service_time_ms": None, "cpu_per_request_ms": None, "cpu_used_cores": None, "cpu_limit_cores": None,
        "cpu_utilization": None, "throttled_ratio": None, "threads": None, "node_cpus": None,
        "node_idle_cores": None, "headroom_cores_per_replica": None, "observed_replicas": len(cur_reps),
    }
    if dt <= 0:
        return out
    if prev_gw is not None and cur_gw is not None and cur_gw.completed >= prev_gw.completed:
        done = cur_gw.completed - prev_gw.completed
        out["completion_rate"] = _round(done / dt, 2)
        out["arrival_rate"] = _round(max(0.0, done + cur_gw.outstanding - prev_gw.outstanding) / dt, 2)
        n = cur_gw.latency_count - prev_gw.latency_count
        if n > 0:
            out["mean_latency_ms"] = _round((cur_gw.latency_sum_s - prev_gw.latency_sum_s) / n * 1000.0, 3)
    used = reqs = model = 0.0
    limits: list[float] = []
    throttled: list[float] = []
    threads: list[float] = []
    node_cpus: list[float] = []
    idle: dict[str, list[float]] = {}  # node -> idle cores seen by each of its replicas
    on_node: dict[str, int] = {}
    allocated: dict[str, float] = {}  # node -> sum of the CPU limits of this service's replicas there
    cpus_of: dict[str, float] = {}
    cpu_known = False
    for url, cur in cur_reps.items():
        if cur.limit_cores is not None:
            limits.append(cur.limit_cores)
        if cur.threads is not None:
            threads.append(cur.threads)
        if cur.node_cpus is not None:
            node_cpus.append(cur.node_cpus)
        node = cur.node or url  # unknown node: as if alone on its own
        on_node[node] = on_node.get(node, 0) + 1
        if cur.limit_cores is not None and cur.node_cpus is not None:
            allocated[node] = allocated.get(node, 0.0) + cur.limit_cores
            cpus_of[node] = cur.node_cpus
        prev = prev_reps.get(url)
        if prev is None:
            continue
        rdt = cur.at - prev.at if cur.at is not None and prev.at is not None and cur.at > prev.at else dt
        d_cpu = _delta(cur.cpu_s, prev.cpu_s)
        if d_cpu is not None:
            used += d_cpu / rdt
            cpu_known = True
        d_req, d_model = _delta(cur.requests, prev.requests), _delta(cur.model_s, prev.model_s)
        if d_req is not None and d_req > 0:
            reqs += d_req
            model += d_model or 0.0
            if d_cpu is None:
                cpu_known = False
        d_p, d_t = _delta(cur.periods, prev.periods), _delta(cur.throttled_periods, prev.throttled_periods)
        if d_p is not None and d_t is not None:
            throttled.append(d_t / d_p if d_p > 0 else 0.0)
        d_idle = _delta(cur.node_idle_s, prev.node_idle_s)
        if d_idle is not None:
            idle.setdefault(node, []).append(d_idle / rdt)
    if cpu_known:
        out["cpu_used_cores"] = _round(used, 3)
        if limits:
            out["cpu_utilization"] = _round(min(1.0, used / sum(limits)) if sum(limits) > 0 else None, 3)
    if reqs > 0:
        out["service_time_ms"] = _round(model / reqs * 1000.0, 4)
        if cpu_known:
            out["cpu_per_request_ms"] = _round(used * dt / reqs * 1000.0, 4)
    out["cpu_limit_cores"] = _round(max(limits), 3) if limits else None
    out["throttled_ratio"] = _round(max(throttled), 3) if throttled else None
    out["threads"] = int(max(threads)) if threads else None
    out["node_cpus"] = int(min(node_cpus)) if node_cpus else None
    if idle:
        out["node_idle_cores"] = _round(min(sum(v) / len(v) for v in idle.values()), 3)
    if allocated and len(allocated) == len(on_node):
        # what each replica could grow into: its node's cores not given to this service's replicas,
        # shared by the replicas there (an allocation, as Kubernetes' allocatable minus requests: the
        # instantaneous idle time of a shared machine is ~0 whenever anything else runs)
        out["headroom_cores_per_replica"] = _round(min(
            max(0.0, cpus_of[n] - allocated[n]) / on_node[n] for n in allocated), 3)
    return out
