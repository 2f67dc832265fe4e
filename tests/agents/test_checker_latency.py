"""The Checker's `latency.checked` payload (pure): sent on a breach, and while replicas above the minimum
could be removed (even with no traffic, so an idle service scales down); never otherwise."""

from __future__ import annotations

import json

from scanflow.agentkit.latency import Percentile
from scanflow.standard.checker import latency_event

SEEN = {"service": "digits", "replicas": 1, "healthy_replicas": 1, "in_flight": 3}


def test_breach_is_sent_with_the_gateway_view() -> None:
    ev = latency_event(SEEN, Percentile(120.0, False), 50.0, 1)
    assert ev is not None and ev["breached"] and ev["latency_ms"] == 120.0 and ev["in_flight"] == 3
    assert ev["replicas"] == 1 and ev["slo_ms"] == 50.0 and not ev["latency_lower_bound"]
    json.dumps(ev, allow_nan=False)


def test_within_the_slo_at_the_minimum_nothing_is_sent() -> None:
    assert latency_event(SEEN, Percentile(20.0, False), 50.0, 1) is None
    assert latency_event(SEEN, None, 50.0, 1) is None


def test_above_the_minimum_every_tick_is_sent_even_idle() -> None:
    three = {**SEEN, "replicas": 3, "healthy_replicas": 3}
    ok = latency_event(three, Percentile(10.0, False), 50.0, 1)
    idle = latency_event(three, None, 50.0, 1)
    assert ok is not None and not ok["breached"] and ok["latency_ms"] == 10.0
    assert idle is not None and idle["latency_ms"] is None and not idle["breached"]


def test_a_lower_bound_at_the_slo_is_a_breach() -> None:
    at_top = latency_event(SEEN, Percentile(50.0, True), 50.0, 1)
    assert at_top is not None and at_top["breached"] and at_top["latency_lower_bound"]
    assert latency_event(SEEN, Percentile(50.0, False), 50.0, 1) is None  # exactly at the SLO: fine


def test_the_slo_override_wins_over_the_declared_one() -> None:
    from scanflow.standard.checker import slo_latency_ms

    assert slo_latency_ms(None, 50.0) == 50.0 and slo_latency_ms(200.0, 50.0) == 200.0
    assert slo_latency_ms(None, None) is None


def _gateway_p99(latencies_s: list[float]) -> Percentile | None:
    """The p99 the Checker's watch computes from the gateway's real latency histogram (its exposition)."""
    from prometheus_client import generate_latest

    from scanflow.agentkit.latency import histogram, percentile_ms
    from scanflow.serving.gateway_server import _Metrics

    m = _Metrics()
    for v in latencies_s:
        m.latency.observe(v)
    text = generate_latest(m.registry).decode()
    return percentile_ms({}, histogram(text, "scanflow_gateway_request_latency_seconds"), 0.99)


def test_the_gateway_buckets_resolve_the_p99_near_the_slo() -> None:
    """S2's decisions sit at 0.6x and 1x a 50-70 ms SLO (scanflow.demo.runner.DEMO_AUTOSCALE, s2_autoscale):
    with the gateway's LATENCY_BUCKETS the Checker reports a 27 ms p99 as 30 ms (low enough to scale down;
    the old 25/50/100 ms bounds said 50) and an overloaded replica's 80 ms as 100 (over a 70 ms SLO)."""
    from scanflow.demo.runner import DEMO_AUTOSCALE
    from scanflow.demo.s2_capacity import SLO_CAP_MS, SLO_MS

    calm = _gateway_p99([0.005] * 95 + [0.027] * 5)
    assert calm == Percentile(30.0, False)
    assert calm.ms <= float(DEMO_AUTOSCALE["latency_low"]) * SLO_MS  # the policy: low at or under it
    assert latency_event({**SEEN, "replicas": 2}, calm, SLO_MS, 1)["breached"] is False  # type: ignore[index]
    overloaded = _gateway_p99([0.02] * 90 + [0.08] * 10)
    assert overloaded == Percentile(100.0, False)
    assert latency_event(SEEN, overloaded, SLO_CAP_MS, 1) is not None
    assert latency_event(SEEN, _gateway_p99([0.02] * 90 + [0.055] * 10), SLO_CAP_MS, 1) is None  # 60 ms: within


def test_observations_ride_along_and_traffic_or_a_grown_replica_is_worth_an_event() -> None:
    obs = {"arrival_rate": 120.0, "cpu_per_request_ms": 0.5, "throttled_ratio": 0.9, "cpu_limit_cores": 0.3}
    ev = latency_event(SEEN, Percentile(20.0, False), 50.0, 1, obs=obs, declared_cpu=1.0)
    assert ev is not None and not ev["breached"] and ev["arrival_rate"] == 120.0 and ev["throttled_ratio"] == 0.9
    assert ev["replicas"] == 1 and ev["in_flight"] == 3  # the gateway's view wins over a same-named field
    json.dumps(ev, allow_nan=False)
    quiet = {**obs, "arrival_rate": 0.0}
    assert latency_event(SEEN, None, 50.0, 1, obs=quiet, declared_cpu=1.0) is None  # idle at its size: nothing
    grown = {**quiet, "cpu_limit_cores": 2.0}
    assert latency_event(SEEN, None, 50.0, 1, obs=grown, declared_cpu=1.0) is not None  # idle but grown: shrink
