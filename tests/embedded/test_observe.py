"""The Checker's observations over one interval (scanflow.agentkit.observe.window), from two scrapes:
rates from counter deltas, per-request CPU and service time, throttling, headroom per node; unknown
(None) wherever a figure cannot be measured, never a made-up zero or a negative rate."""

from __future__ import annotations

import json

import pytest

from scanflow.agentkit.observe import GatewaySample, ReplicaSample, parse_gateway, window


def rep(at: float, cpu_s: float, req: float, model_s: float, *, limit: float = 1.0, periods: float | None = 100,
        throttled: float | None = 0, idle: float = 0.0, node: str | None = "n1", threads: float = 1,
        node_cpus: float = 4) -> ReplicaSample:
    return ReplicaSample(at=at, cpu_s=cpu_s, limit_cores=limit, periods=periods, throttled_periods=throttled,
                         requests=req, model_s=model_s, threads=threads, node_cpus=node_cpus, node_idle_s=idle,
                         node=node)


G0 = GatewaySample(completed=1000, latency_sum_s=10.0, latency_count=1000, outstanding=4)
G1 = GatewaySample(completed=1600, latency_sum_s=13.0, latency_count=1600, outstanding=10)


def test_rates_and_per_request_costs_over_the_interval() -> None:
    r0 = {"a": rep(100.0, 50.0, 1000, 0.8, idle=1000.0)}
    r1 = {"a": rep(102.0, 51.2, 1600, 1.28, periods=120, throttled=15, idle=1003.0)}
    o = window(G0, G1, r0, r1, 2.0)
    assert o["completion_rate"] == 300.0
    assert o["arrival_rate"] == 303.0  # answered + the in-flight rise: (600 + 6) / 2
    assert o["mean_latency_ms"] == pytest.approx(5.0)  # 3 s over 600 requests
    assert o["service_time_ms"] == pytest.approx(0.8)  # 0.48 s of model time over 600 requests
    assert o["cpu_used_cores"] == pytest.approx(0.6) and o["cpu_per_request_ms"] == pytest.approx(2.0)
    assert o["cpu_utilization"] == pytest.approx(0.6) and o["throttled_ratio"] == pytest.approx(0.75)
    assert o["node_idle_cores"] == pytest.approx(1.5)
    assert o["headroom_cores_per_replica"] == pytest.approx(3.0)  # 4 CPUs - 1 core given to it
    json.dumps(o, allow_nan=False)


def test_first_tick_restart_and_silence_give_unknowns_not_zeros() -> None:
    first = window(None, G1, {}, {"a": rep(1.0, 5.0, 10, 0.1)}, 1.0)
    assert first["arrival_rate"] is None and first["cpu_used_cores"] is None and first["service_time_ms"] is None
    assert first["cpu_limit_cores"] == 1.0 and first["observed_replicas"] == 1  # gauges are known at once
    restarted = window(G1, G0, {"a": rep(1.0, 50.0, 900, 1.0)}, {"a": rep(2.0, 0.5, 10, 0.01)}, 1.0)
    assert restarted["arrival_rate"] is None and restarted["cpu_used_cores"] is None  # counters went back
    idle = window(G1, G1, {"a": rep(1.0, 5.0, 10, 0.1)}, {"a": rep(2.0, 5.01, 10, 0.1)}, 1.0)
    assert idle["arrival_rate"] == 0 and idle["service_time_ms"] is None and idle["cpu_per_request_ms"] is None
    assert idle["cpu_used_cores"] == pytest.approx(0.01)


def test_replicas_sharing_a_node_share_its_headroom() -> None:
    r0 = {u: rep(0.0, 0.0, 0, 0.0, limit=1.0, node="n1") for u in ("a", "b")}
    r0["c"] = rep(0.0, 0.0, 0, 0.0, limit=2.0, node="n2", node_cpus=8)
    r1 = {u: rep(1.0, 0.5, 100, 0.05, limit=1.0, node="n1") for u in ("a", "b")}
    r1["c"] = rep(1.0, 1.0, 100, 0.05, limit=2.0, node="n2", node_cpus=8)
    o = window(G0, G1, r0, r1, 1.0)
    assert o["headroom_cores_per_replica"] == pytest.approx(1.0)  # n1: (4 - 2) / 2; n2: 8 - 2 = 6
    assert o["cpu_limit_cores"] == 2.0 and o["cpu_used_cores"] == pytest.approx(2.0)
    assert o["cpu_utilization"] == pytest.approx(0.5)


def test_a_replica_without_cgroup_figures_reports_no_throttling() -> None:
    r0 = {"a": rep(0.0, 0.0, 0, 0.0, periods=None, throttled=None)}
    r1 = {"a": rep(1.0, 0.5, 100, 0.05, periods=None, throttled=None)}
    assert window(G0, G1, r0, r1, 1.0)["throttled_ratio"] is None


def test_parse_gateway_needs_its_histogram() -> None:
    text = ("# TYPE scanflow_gateway_requests counter\nscanflow_gateway_requests_total{status=\"200\",route=\"primary\"} 7\n"
            "scanflow_gateway_requests_total{status=\"503\",route=\"none\"} 1\n"
            "# TYPE scanflow_gateway_request_latency_seconds histogram\n"
            "scanflow_gateway_request_latency_seconds_bucket{le=\"+Inf\"} 8\n"
            "scanflow_gateway_request_latency_seconds_count 8\nscanflow_gateway_request_latency_seconds_sum 0.4\n"
            "# TYPE scanflow_gateway_outstanding gauge\nscanflow_gateway_outstanding 2\n")
    assert parse_gateway(text) == GatewaySample(completed=8, latency_sum_s=0.4, latency_count=8, outstanding=2)
    assert parse_gateway("") is None
