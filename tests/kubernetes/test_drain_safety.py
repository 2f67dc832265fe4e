"""The prod overlay lets a node be drained: every disruption budget allows one eviction at any replica
count the workload may run, and the gateways spread over nodes (#26)."""

from __future__ import annotations

from typing import Any

from scanflow.platform import manifests as mf
from scanflow.spec import load_workflow
from tests.kubernetes.netpol import selects
from tests.kubernetes.test_manifests import WORKFLOW, kustomize


def allowed_disruptions(pdb: dict[str, Any], healthy: int) -> int:
    """Pure: evictions a PodDisruptionBudget (integer fields) allows with `healthy` pods up."""
    spec = pdb["spec"]
    if "maxUnavailable" in spec:
        return max(0, min(int(spec["maxUnavailable"]), healthy))
    return max(0, healthy - int(spec["minAvailable"]))


def _workloads() -> list[dict[str, Any]]:
    """The prod overlay's workloads, and the replicas' Deployments the Executor creates."""
    return [d for d in kustomize("prod") + mf.workflow_manifests(load_workflow(WORKFLOW), namespace="scanflow")
            if d["kind"] in ("Deployment", "StatefulSet")]


def test_every_budget_allows_a_drain_at_every_replica_count() -> None:
    wf = load_workflow(WORKFLOW)
    pdbs = [d for d in kustomize("prod") if d["kind"] == "PodDisruptionBudget"]
    assert pdbs
    for pdb in pdbs:
        chosen = [w for w in _workloads()
                  if selects(pdb["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert chosen, f"PDB {pdb['metadata']['name']} selects no workload"
        for w in chosen:
            svc = next((s for s in wf.services if s.name == w["metadata"]["name"]), None)
            lowest = min(svc.min_replicas, svc.replicas) if svc else w["spec"].get("replicas", 1)
            for healthy in range(max(1, lowest), w["spec"].get("replicas", 1) + 1):
                assert allowed_disruptions(pdb, healthy) >= 1, (
                    f"PDB {pdb['metadata']['name']} blocks every eviction of {w['metadata']['name']} "
                    f"at {healthy} replica(s): a drain of its node would hang")


def test_allowed_disruptions_reads_both_forms() -> None:
    assert allowed_disruptions({"spec": {"minAvailable": 1}}, 1) == 0  # what the old budget did
    assert allowed_disruptions({"spec": {"minAvailable": 1}}, 3) == 2
    assert allowed_disruptions({"spec": {"maxUnavailable": 1}}, 1) == 1
    assert allowed_disruptions({"spec": {"maxUnavailable": 1}}, 0) == 0


def test_the_gateways_spread_over_nodes_without_blocking_a_one_node_cluster() -> None:
    gw = next(w for w in _workloads() if w["metadata"]["name"] == "digits-gateway")
    assert gw["spec"]["replicas"] >= 2
    (spread,) = gw["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert selects(spread["labelSelector"], gw["spec"]["template"]["metadata"]["labels"])


def test_agents_are_ready_when_their_store_answers_and_alive_while_they_serve() -> None:
    """Readiness on /ready (the store answers: an agent whose database is gone leaves its Service),
    liveness on /health (a restart would not bring a database back); both are routes of the agent app."""
    from scanflow.agent import Agent
    from scanflow.agent.app import create_app

    paths = set(create_app(Agent("probe")).openapi()["paths"])
    agents = [w for w in _workloads() if w["spec"]["template"]["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "agent"]
    assert len(agents) == 4
    for w in agents:
        (c,) = w["spec"]["template"]["spec"]["containers"]
        ready, live = c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]
        assert (ready, live) == ("/ready", "/health"), w["metadata"]["name"]
        assert {ready, live} <= paths
