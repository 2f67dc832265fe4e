"""Writes grafana-dashboard.json beside this file: the Scanflow loop at a glance in Grafana.

The dashboard is generated (not hand-edited JSON) so each panel stays a readable line here; run
`python deploy/observability/build_dashboard.py` after changing a panel. tests/contracts/test_dashboard.py
checks that every metric a panel, an annotation or a variable queries is one the agents, gateways or
replicas really export. Two variables, `workflow` and `service`, keep two workflows from overlaying;
promotions and retrain plans are marked on every panel.
"""

from __future__ import annotations

import json
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}
WF = 'workflow=~"$workflow", service=~"$service"'  # the agents' series: the workflow and service chosen above
SVC = 'service=~"$service"'  # the gateways' and replicas' series (labelled by the scrape configuration)

# (title, unit, [(PromQL, legend)]), laid out two per row
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Latency p99 vs SLO", "s", [
        (("histogram_quantile(0.99, sum by (le, service) "
         f"(rate(scanflow_gateway_request_latency_seconds_bucket{{{SVC}}}[1m])))"), "p99 at the gateway {{service}}"),
        (f"scanflow_latency_slo_seconds{{{WF}}}", "SLO {{service}}"),
    ]),
    ("Requests by status", "reqps", [
        (f"sum by (status) (rate(scanflow_gateway_requests_total{{{SVC}}}[1m]))", "{{status}}"),
    ]),
    ("Replicas", "short", [
        (f"scanflow_latency_replicas{{{WF}}}", "serving (gateway) {{service}}"),
        (f"scanflow_latency_healthy_replicas{{{WF}}}", "healthy {{service}}"),
        (f"scanflow_plan_replicas{{{WF}}}", "Planner asked {{service}}"),
        (f"scanflow_action_replicas{{{WF}}}", "Executor set {{service}}"),
    ]),
    ("Drift", "short", [
        (f"scanflow_drift_score{{{WF}}}", "score {{service}}"),
        (f"scanflow_drift_p_value{{{WF}}}", "p-value {{service}}"),
        (f"increase(scanflow_drift_flag_total{{{WF}}}[5m])", "drifted checks (5 min) {{service}}"),
    ]),
    ("Accuracy: label-free estimate vs measured from feedback", "percentunit", [
        (f"scanflow_performance_estimated_accuracy{{{WF}}}", "estimated {{service}}"),
        (f"scanflow_performance_measured_accuracy{{{WF}}}", "measured (feedback) {{service}}"),
    ]),
    ("Decisions", "short", [
        ("sum by (result) (increase(scanflow_agent_decisions_total[5m]))", "strategy {{result}}"),
        (f"increase(scanflow_plan_retrain_total{{{WF}}}[5m])", "retrains planned (5 min) {{service}}"),
        (f"scanflow_plan_route_backup{{{WF}}}", "routed to backup {{service}}"),
        (f"increase(scanflow_action_promoted_total{{{WF}}}[5m])", "promotions (5 min) {{service}}"),
        (f"scanflow_action_swapped_version{{{WF}}}", "serving version {{service}}"),
    ]),
    # Two sources: the replicas' own /metrics where Prometheus reaches them (Kubernetes pods), and the
    # Checker's per-service gauges from its observations, which is the only one on compose (the replicas
    # listen on the Executor container's loopback there).
    ("Replica CPU: used vs limit (cores)", "short", [
        (f"rate(scanflow_replica_cpu_seconds_total{{{SVC}}}[1m])", "used {{instance}}"),
        (f"scanflow_replica_cpu_limit_cores{{{SVC}}}", "limit {{instance}}"),
        (f"scanflow_resources_cpu_used_cores{{{WF}}}", "used, all replicas (Checker) {{service}}"),
        (f"scanflow_resources_cpu_limit_cores{{{WF}}}", "largest limit (Checker) {{service}}"),
        (f"scanflow_resources_throttled_ratio{{{WF}}}", "throttled share (Checker) {{service}}"),
    ]),
    ("Replica load", "short", [
        (f"scanflow_replica_in_flight{{{SVC}}}", "in flight {{instance}}"),
        (f"scanflow_replica_threads{{{SVC}}}", "threads {{instance}}"),
        (f"scanflow_gateway_outstanding{{{SVC}}}", "gateway outstanding {{instance}}"),
    ]),
]

# (name, colour, PromQL): a mark on every panel when the count went up (a promotion, a retrain plan)
ANNOTATIONS: list[tuple[str, str, str]] = [
    ("Challenger promoted", "green", f"changes(scanflow_action_promoted_total{{{WF}}}[1m]) > 0"),
    ("Retrain planned", "orange", f"changes(scanflow_plan_retrain_total{{{WF}}}[1m]) > 0"),
]


def variable(name: str, label: str, query: str) -> dict[str, object]:
    """A Grafana query variable over a label's values (all selected by default)."""
    return {"name": name, "label": label, "type": "query", "datasource": DS, "query": query, "refresh": 2,
            "includeAll": True, "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}}


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
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            variable("workflow", "Workflow", "label_values(scanflow_drift_score, workflow)"),
            variable("service", "Service", 'label_values(scanflow_drift_score{workflow=~"$workflow"}, service)'),
        ]},
        "annotations": {"list": [
            {"name": name, "datasource": DS, "enable": True, "iconColor": colour, "expr": expr, "step": "30s",
             "titleFormat": name, "textFormat": "{{workflow}} / {{service}}"}
            for name, colour, expr in ANNOTATIONS]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("grafana-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
