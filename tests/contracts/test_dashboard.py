"""The Grafana dashboard queries only metrics the product exports, and the agents export their
monitoring values on /metrics.

The exported names are gathered from the real sources: the agent runtime's registry, the gateway's
and replica's metric classes, the monitoring payload functions, and every `"<group>/<name>"` key the
agents pass to the monitoring writer. A panel querying a renamed or never-written metric fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from scanflow.tracking import monitoring
from scanflow.tracking.latest import LatestValues, metric_name

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "observability" / "grafana-dashboard.json"
PROMQL_WORDS = {"sum", "by", "rate", "increase", "changes", "histogram_quantile", "label_values", "le", "service",
                "workflow", "status", "result", "instance", "avg", "max", "min"}


def _family_samples(registry: CollectorRegistry) -> set[str]:
    names = set()
    for fam in registry.collect():
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names.update(fam.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def exported_names() -> set[str]:
    from scanflow.agent.metrics import Metrics
    from scanflow.serving.gateway_server import _Metrics as GatewayMetrics
    from scanflow.serving.replica_server import _Metrics as ReplicaMetrics

    names = _family_samples(Metrics().registry) | _family_samples(GatewayMetrics().registry)
    names |= _family_samples(ReplicaMetrics().registry)
    keys = set(monitoring.drift_metrics({"score": 1, "p_value": 0.5, "drift_rate": 0.1, "n": 5, "drift": True,
                                         "detector_version": 1})[0])
    keys |= set(monitoring.latency_metrics({"latency_ms": 1, "slo_ms": 2, "breached": False, "replicas": 1,
                                            "healthy_replicas": 1, "in_flight": 0}, 99.0))
    keys |= set(monitoring.retrain_decision_metrics(True, [True], 3, 2))
    keys |= set(monitoring.resource_metrics({"cpu_used_cores": 1.0, "cpu_limit_cores": 1.0, "cpu_utilization": 0.5,
                                             "throttled_ratio": 0.1, "threads": 1}))
    for source in (ROOT / "scanflow" / "standard").glob("*.py"):
        keys |= set(re.findall(r'"((?:plan|action|drift|latency|accuracy|performance|resources)/[a-z0-9_]+)"', source.read_text()))
    return names | {n for n in map(metric_name, keys) if n is not None}


def queried_names() -> set[str]:
    """Every metric the panels, the annotations and the variables query."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    words = {w for e in exprs for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r"\[[^]]*]", "", e))}
    return {w for w in words if w not in PROMQL_WORDS}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    queried = queried_names()
    assert queried, "the dashboard queries nothing"
    missing = queried - exported_names()
    assert not missing, f"dashboard queries metrics nothing exports: {sorted(missing)}"


def test_dashboard_file_is_what_the_builder_writes() -> None:
    import runpy

    built = runpy.run_path(str(DASHBOARD.with_name("build_dashboard.py")))["dashboard"]()
    assert json.loads(DASHBOARD.read_text()) == built


def test_monitoring_values_become_prometheus_gauges() -> None:
    latest = LatestValues()
    registry = CollectorRegistry()
    registry.register(latest)
    latest.record("digits", "digits", {"drift/score": 2.5, "latency/p99_ms": 31.0, "latency/slo_ms": 50.0,
                                       "plan/retrain": 1.0})
    latest.record("digits", "digits", {"drift/score": 0.5, "plan/retrain": 0.0})
    latest.record("digits", "digits", {"plan/retrain": 1.0})
    text = generate_latest(registry).decode()
    assert 'scanflow_drift_score{service="digits",workflow="digits"} 0.5' in text  # a level: the last value
    assert 'scanflow_latency_slo_seconds{service="digits",workflow="digits"} 0.05' in text  # seconds, not ms
    assert "# TYPE scanflow_plan_retrain_total counter" in text  # an event: how many times it happened
    assert 'scanflow_plan_retrain_total{service="digits",workflow="digits"} 2.0' in text
    assert "p99" not in text  # a precomputed percentile: Prometheus takes it from the gateway's histogram


def test_the_monitor_writer_feeds_the_agents_metrics_endpoint(monkeypatch) -> None:
    """What an agent submits for MLflow shows on its /metrics registry (the MLflow write itself is
    covered by tests/tracking; here it is replaced so no server is needed)."""
    from scanflow.agent.metrics import Metrics
    from scanflow.tracking.latest import LATEST

    monkeypatch.setattr(monitoring, "ensure_monitor_run", lambda target: "run-id")
    monkeypatch.setattr(monitoring, "log_metrics", lambda *args, **kwargs: None)
    LATEST.clear()
    writer = monitoring.MonitorWriter()
    writer.submit(None, monitoring.MonitorTarget("wf", "svc", "/home"), {"plan/replicas": 3.0}, 1)
    assert writer.flush(30.0)
    text = generate_latest(Metrics().registry).decode()
    assert 'scanflow_plan_replicas{service="svc",workflow="wf"} 3.0' in text
