"""Writes grafana-dashboard.json beside this file: the Scanflow loop at a glance in Grafana.

The dashboard is generated (not hand-edited JSON) so each panel stays a readable line here; run
`python deploy/observability/build_dashboard.py` after changing a panel. tests/contracts/test_dashboard.py
checks that every metric a panel queries is one the agents, gateways or replicas really export.
"""

from __future__ import annotations

import json
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}

# (title, unit, [(PromQL, legend)]), laid out two per row
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Latency p99 vs SLO", "ms", [
        ("1000 * histogram_quantile(0.99, sum by (le, service) "
         "(rate(scanflow_gateway_request_latency_seconds_bucket[1m])))", "p99 at the gateway {{service}}"),
        ("scanflow_latency_slo_ms", "SLO {{service}}"),
    ]),
    ("Requests by status", "reqps", [
        ("sum by (status) (rate(scanflow_gateway_requests_total[1m]))", "{{status}}"),
    ]),
    ("Replicas", "short", [
        ("scanflow_latency_replicas", "serving (gateway) {{service}}"),
        ("scanflow_latency_healthy_replicas", "healthy {{service}}"),
        ("scanflow_plan_replicas", "Planner asked {{service}}"),
        ("scanflow_action_replicas", "Executor set {{service}}"),
    ]),
    ("Drift", "short", [
        ("scanflow_drift_score", "score {{service}}"),
        ("scanflow_drift_p_value", "p-value {{service}}"),
        ("scanflow_drift_flag", "drift (0/1) {{service}}"),
    ]),
    ("Accuracy: label-free estimate vs measured from feedback", "percentunit", [
        ("scanflow_performance_estimated_accuracy", "estimated {{service}}"),
        ("scanflow_performance_measured_accuracy", "measured (feedback) {{service}}"),
    ]),
    ("Decisions", "short", [
        ("sum by (result) (increase(scanflow_agent_decisions_total[5m]))", "strategy {{result}}"),
        ("scanflow_plan_retrain", "retrain planned {{service}}"),
        ("scanflow_plan_route_backup", "routed to backup {{service}}"),
        ("scanflow_action_promoted", "challenger promoted {{service}}"),
        ("scanflow_action_swapped_version", "serving version {{service}}"),
    ]),
    # Two sources: the replicas' own /metrics where Prometheus reaches them (Kubernetes pods), and the
    # Checker's per-service gauges from its observations, which is the only one on compose (the replicas
    # listen on the Executor container's loopback there).
    ("Replica CPU: used vs limit (cores)", "short", [
        ("rate(scanflow_replica_cpu_seconds_total[1m])", "used {{instance}}"),
        ("scanflow_replica_cpu_limit_cores", "limit {{instance}}"),
        ("scanflow_resources_cpu_used_cores", "used, all replicas (Checker) {{service}}"),
        ("scanflow_resources_cpu_limit_cores", "largest limit (Checker) {{service}}"),
        ("scanflow_resources_throttled_ratio", "throttled share (Checker) {{service}}"),
    ]),
    ("Replica load", "short", [
        ("scanflow_replica_in_flight", "in flight {{instance}}"),
        ("scanflow_replica_threads", "threads {{instance}}"),
        ("scanflow_gateway_outstanding", "gateway outstanding {{instance}}"),
    ]),
]


def panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, object]:
    return {
        "id": i + 1, "type": "timeseries", "title": title, "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                    for j, (expr, legend) in enumerate(targets)],
    }


def dashboard() -> dict[str, object]:
    return {
        "uid": "scanflow-loop", "title": "Scanflow: the autonomic loop", "schemaVersion": 39, "version": 1,
        "tags": ["scanflow"], "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("grafana-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
