"""The prod overlay's NetworkPolicies admit every connection the loop is configured to make.

The edges come from the rendered manifests (tests/kubernetes/loop_edges.py): the prod overlay's
workloads, and what the Executor creates there (each service's replicas, with the Tracker URL the
Executor is configured to hand them, and a training Job). Each is checked against the rendered policies
(tests/kubernetes/netpol.py); that nothing beyond them is open is test_scrape_reach's matrix.
"""

from __future__ import annotations

from typing import Any

from scanflow.platform import manifests as mf
from scanflow.spec import Job, Resources, load_workflow
from tests.kubernetes.loop_edges import Edge, loop_edges, pods_by_name
from tests.kubernetes.netpol import admits
from tests.kubernetes.test_manifests import WORKFLOW, kustomize

NS = "scanflow"
NS_LABELS = {NS: {"kubernetes.io/metadata.name": NS}}


def _env(docs: list[dict[str, Any]], workload: str, name: str) -> str | None:
    doc = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == workload)
    return next((e.get("value") for c in doc["spec"]["template"]["spec"]["containers"]
                 for e in c.get("env") or [] if e["name"] == name), None)


def _prod_and_generated() -> list[dict[str, Any]]:
    prod = kustomize("prod")
    generated = mf.workflow_manifests(load_workflow(WORKFLOW), namespace=NS,
                                      tracker_url=_env(prod, "executor", "SCANFLOW_TRACKER_URL"))
    generated.append(mf.batch_job(Job(name="train", entrypoint="m:f", resources=Resources(cpu=1)), "train-1",
                                  namespace=NS))
    return prod + generated


def test_the_loop_edges_are_derived_from_the_configuration() -> None:
    """The derivation finds what the loop is known to need; a derivation that found nothing would make
    the next test pass on any policy."""
    edges = {(e.src, e.dst, e.port) for e in loop_edges(_prod_and_generated(), NS)}
    assert {("checker", "digits", 8080),  # the Checker reads the replicas' /metrics (CPU, throttling)
            ("checker", "digits-gateway", 8080), ("digits-gateway", "digits", 8080),
            ("digits", "tracker", 8080), ("digits", "mlflow", 5000), ("train-1", "mlflow", 5000),
            ("planner", "executor", 8080), ("tracker", "postgres", 5432), ("mlflow", "postgres", 5432)} <= edges
    assert len({src for src, _, _ in edges}) >= 9


def test_every_edge_the_loop_needs_is_admitted_by_the_prod_policies() -> None:
    docs = _prod_and_generated()
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies, "the prod overlay renders no NetworkPolicy"
    pods = pods_by_name(docs, NS)
    blocked = sorted((e for e in loop_edges(docs, NS) if not admits(policies, pods[e.src], pods[e.dst], e.port, NS_LABELS)),
                     key=lambda e: (e.src, e.dst))
    assert blocked == [], "\n".join(f"{e.src} -> {e.dst}:{e.port} ({e.why})" for e in blocked)


def test_an_edge_is_named_by_the_setting_it_comes_from() -> None:
    docs = _prod_and_generated()
    assert Edge("digits", "tracker", 8080, "SCANFLOW_TRACKER_URL") in loop_edges(docs, NS)
