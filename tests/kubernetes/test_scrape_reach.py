"""Prometheus on Kubernetes: which pods deploy/observability/prometheus-kubernetes.yml scrapes (its
relabelling applied to the pods the prod overlay and the Executor's manifests run), and which
connections the prod overlay's NetworkPolicies admit: Prometheus in `monitoring` reaches every scraped
port, and the whole reachability matrix is exactly the intended one (nothing else got opened)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from scanflow.platform import manifests as mf
from scanflow.spec import Job, Resources, load_workflow
from tests.kubernetes.netpol import Pod, admits, pods_of
from tests.kubernetes.test_manifests import ROOT, WORKFLOW, kustomize

NS = "scanflow"
CONFIG = ROOT / "deploy/observability/prometheus-kubernetes.yml"
NS_LABELS = {n: {"kubernetes.io/metadata.name": n} for n in (NS, "monitoring", "default")}
PROMETHEUS = Pod("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
ELSEWHERE = Pod("client", "default", {"app": "client"})


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def discovered(pod: Pod, ip: str, phase: str = "Running") -> list[dict[str, str]]:
    """The targets Prometheus's pod role makes of one pod: one per container port (one without a port
    when it declares none), with the meta labels documented for `role: pod`."""
    meta = {"__meta_kubernetes_namespace": pod.namespace, "__meta_kubernetes_pod_name": pod.name,
            "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_phase": phase,
            **{f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in pod.labels.items()},
            **{f"__meta_kubernetes_pod_annotation_{_sanitize(k)}": v for k, v in pod.annotations.items()}}
    return [{**meta, "__address__": f"{ip}:{p}" if p else ip, "__metrics_path__": "/metrics"}
            for p in (pod.ports or (0,))]


def relabel(labels: dict[str, str], rules: list[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabelling (replace and keep; regex anchored, `$1` replacements, an empty result
    deletes the label), then the meta labels dropped; None when a keep rule drops the target."""
    out = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(out.get(s, "") for s in rule.get("source_labels") or [])
        m = re.fullmatch(str(rule.get("regex", "(.*)")), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if m is None:
                return None
        elif action == "replace":
            if m is not None:
                new = m.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", str(rule.get("replacement", "$1"))))
                if new:
                    out[rule["target_label"]] = new
                else:
                    out.pop(rule["target_label"], None)
        else:
            raise AssertionError(f"relabel action {action} is not modelled here")
    return {k: v for k, v in out.items() if not k.startswith("__meta_")}


def _scraped_pods() -> list[Pod]:
    """The pods the prod overlay runs and those the Executor creates for the test workflow, in NS."""
    generated = mf.workflow_manifests(load_workflow(WORKFLOW))
    generated.append(mf.batch_job(Job(name="train", entrypoint="m:f", resources=Resources(cpu=1)), "train-1"))
    return pods_of(kustomize("prod"), NS) + [Pod(p.name, NS, p.labels, p.ports, p.annotations)
                                             for p in pods_of(generated, NS)]


def test_the_kubernetes_config_scrapes_the_annotated_pods_of_the_namespace() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    (job,) = config["scrape_configs"]
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [NS]
    pods = _scraped_pods()
    stranger = next(p for p in pods if p.name == "tracker")
    pods.append(Pod("tracker", "other", stranger.labels, stranger.ports, stranger.annotations))

    targets: dict[str, dict[str, str]] = {}
    for i, pod in enumerate(pods):
        if pod.namespace not in sd["namespaces"]["names"]:
            continue  # discovery never lists it
        for phase in ("Running", "Pending"):
            for t in discovered(pod, f"10.0.0.{i + 1}", phase):
                kept = relabel(t, job["relabel_configs"])
                if kept is not None:
                    assert phase == "Running", f"{pod.name}: a {phase} pod is scraped"
                    assert targets.setdefault(pod.name, kept) == kept  # one target per pod
    annotated = {p.name for p in pods if p.namespace == NS and p.annotations.get("prometheus.io/scrape") == "true"}
    assert set(targets) == annotated
    assert {"tracker", "checker", "planner", "executor", "digits-gateway", "digits"} <= annotated
    assert not {"mlflow", "postgres", "scanflow-bootstrap", "train-1"} & set(targets)
    for name, t in targets.items():
        pod = next(p for p in pods if p.name == name and p.namespace == NS)
        assert t["__address__"].endswith(f":{pod.annotations['prometheus.io/port']}"), t
        assert t["__metrics_path__"] == pod.annotations["prometheus.io/path"] == "/metrics"
        assert t["pod"] == name
    # the labels the dashboard groups by, as the compose configuration (prometheus.yml) gives them
    for agent in ("tracker", "checker", "planner", "executor"):
        assert targets[agent]["component"] == agent and "service" not in targets[agent]
    assert (targets["digits-gateway"]["component"], targets["digits-gateway"]["service"]) == ("gateway", "digits")
    assert (targets["digits"]["component"], targets["digits"]["service"]) == ("replica", "digits")


def _role(pod: Pod) -> str:
    if pod is PROMETHEUS:
        return "monitoring"
    if pod is ELSEWHERE:
        return "elsewhere"
    component = pod.labels["app.kubernetes.io/component"]
    if component == "agent" and pod.labels.get("app.kubernetes.io/name") == "checker":
        return "checker"  # the one agent that reads the replicas' /metrics
    return {"tracking": "mlflow", "database": "postgres"}.get(component, component)


def test_prometheus_reaches_every_scraped_port_and_nothing_else_was_opened() -> None:
    policies = [d for d in kustomize("prod") if d["kind"] == "NetworkPolicy"]
    assert all(p["metadata"]["namespace"] == NS for p in policies)
    pods = _scraped_pods()
    for pod in pods:
        if pod.annotations.get("prometheus.io/scrape") == "true":
            port = int(pod.annotations["prometheus.io/port"])
            assert admits(policies, PROMETHEUS, pod, port, NS_LABELS), f"Prometheus cannot scrape {pod.name}:{port}"
            assert not admits(policies, ELSEWHERE, pod, port, NS_LABELS) or _role(pod) == "gateway", pod.name

    # the whole matrix: (source, destination, port) for every port a pod declares, and one it does not
    opened = {(_role(src), _role(dst), port) for dst in pods for port in (*dst.ports, 9999)
              for src in [*pods, PROMETHEUS, ELSEWHERE] if admits(policies, src, dst, port, NS_LABELS)}
    agents = ("agent", "checker")
    everyone = {*agents, "gateway", "replica", "job", "mlflow", "postgres", "monitoring", "elsewhere"}
    expected = ({(s, "gateway", 8080) for s in everyone}
                | {(s, "replica", 8080) for s in ("gateway", "checker", "monitoring")}
                | {(s, "mlflow", 5000) for s in (*agents, "replica", "job")}
                | {(s, "postgres", 5432) for s in ("mlflow", *agents)}
                | {(s, a, 8080) for s in (*agents, "replica", "gateway", "monitoring") for a in agents})
    assert opened == expected, {"unexpected": opened - expected, "missing": expected - opened}


def test_the_monitoring_namespace_is_the_one_setting() -> None:
    """The policy names the namespace by the label Kubernetes sets on every namespace, and a Prometheus
    in any other namespace is refused (change the policy, docs/kubernetes.md)."""
    pol = next(d for d in kustomize("prod") if d["kind"] == "NetworkPolicy"
               and d["metadata"]["name"] == "metrics-from-monitoring")
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    replica = next(p for p in _scraped_pods() if p.name == "digits")
    moved = Pod("prometheus-0", "observability", PROMETHEUS.labels)
    labels = {**NS_LABELS, "observability": {"kubernetes.io/metadata.name": "observability"}}
    assert not admits([d for d in kustomize("prod") if d["kind"] == "NetworkPolicy"], moved, replica, 8080, labels)
    assert "metrics-from-monitoring" in (ROOT / "docs/kubernetes.md").read_text()


@pytest.mark.parametrize("path", ["docs/kubernetes.md", "deploy/observability/prometheus.yml"])
def test_the_kubernetes_config_is_referenced(path: str) -> None:
    assert "prometheus-kubernetes.yml" in (ROOT / path).read_text()
