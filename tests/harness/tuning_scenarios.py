"""S2 (autoscale) and S3 (tune) on the emulated cluster: the demo's own scenarios (scanflow.demo.
s2_autoscale, scanflow.demo.s3_tune), run unchanged against the cluster's Services instead of an
embedded stack.

What differs is configuration only, as it would for an operator: the Planner gets the demo's variant
of the workflow (its autoscale strategy off until the scenario turns it on over REST, its guardrail
durations scaled down: scanflow.demo.runner.demo_workflow), through a ConfigMap mounted in its pod and
SCANFLOW_WORKFLOW, which rolls the Planner (its store on PostgreSQL keeps its decisions); it is
rolled back onto the declared workflow afterwards.
The replicas' CPU limits are their containers' cgroups (pod_cgroups.py): `set_resources` is an
in-place resize (or a rolling update when the thread count changes), and the replica reads its own
limit and throttling there, as on a node. The scenarios time one replica's CPU through its process id,
which the emulated kubelet knows (`ClusterStack.get` adds it to the Executor's /services answer: a
real cluster's Executor reports pods, not processes).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from .cluster import Cluster
from .waiting import deployment_ready, svc, wait_for

ROLES = ("tracker", "checker", "planner", "executor")
DEMO_WORKFLOW = "/etc/scanflow-demo/workflow.yaml"


class ClusterStack:
    """What scanflow.demo's scenarios read of a stack (EmbeddedStack's names), over the emulated
    cluster: the gateway's Service, the agents' Services, the operator's token."""

    def __init__(self, cluster: Cluster, token: str, workflow: Any) -> None:
        self.cluster, self.token, self.workflow = cluster, token, workflow
        self.service_url = "http://digits-gateway:8080"
        self.agent_urls = {r: svc(cluster, r) for r in ROLES}

    def get(self, role: str, path: str, **params: Any) -> Any:
        r = httpx.get(self.agent_urls[role] + path, params=params or None, timeout=30.0,
                      headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        body = r.json()
        if role == "executor" and path == "/services":
            for service in body.values():
                for rep in service.get("replicas") or []:
                    pod = self.cluster.pods.get(str(rep.get("name")))
                    if pod is not None and pod.proc is not None:
                        rep["pid"] = pod.proc.pid
        return body

    def decisions(self, role: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.get(role, "/decisions", limit=limit))


def planner_on_workflow(cluster: Cluster, path: str | None) -> str:
    """Roll the Planner onto the workflow file `path` (None: the demo's variant, from a ConfigMap mounted
    in its pod) by its SCANFLOW_WORKFLOW; returns the path it had."""
    from scanflow.demo.runner import demo_workflow

    dep = cluster.get("apps/v1", "Deployment", "planner") or {}
    spec = dep["spec"]["template"]["spec"]
    container = spec["containers"][0]
    before = next(e["value"] for e in container["env"] if e["name"] == "SCANFLOW_WORKFLOW")
    if path is None:
        path = DEMO_WORKFLOW
        cluster.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "planner-demo-workflow", "namespace": cluster.namespace},
                        "data": {"workflow.yaml": demo_workflow().to_yaml()}}])
        container["volumeMounts"] = [*container.get("volumeMounts", []),
                                     {"name": "demo-workflow", "mountPath": str(Path(DEMO_WORKFLOW).parent)}]
        spec["volumes"] = [*spec.get("volumes", []),
                           {"name": "demo-workflow", "configMap": {"name": "planner-demo-workflow"}}]
    container["env"] = [e for e in container["env"] if e["name"] != "SCANFLOW_WORKFLOW"] + [
        {"name": "SCANFLOW_WORKFLOW", "value": path}]
    cluster._merge("apps/v1", "Deployment", "planner", {"spec": {"replicas": 1, "template": dep["spec"]["template"]}})

    def rolled() -> bool:
        pods = cluster._owned("Deployment", "planner")
        return deployment_ready(cluster, "planner") and len(pods) == 1 and pods[0].env.get(
            "SCANFLOW_WORKFLOW") == path and pods[0].ready

    wait_for(rolled, 180, f"the Planner on {path}", interval_s=1)
    return str(before)


def run_tuning(cluster: Cluster, token: str, scenarios: list[str], world_drifted: bool,
               result: dict[str, Any]) -> None:
    """S2 and/or S3 as the demo runs them; each one's verdict, figures and decisions into `result`."""
    from scanflow.demo import s2_autoscale, s3_tune
    from scanflow.demo.common import DemoContext
    from scanflow.demo.runner import demo_workflow

    if cluster.cgroups.reason:  # the scenarios would run on unlimited replicas and judge nothing real
        result["tuning_unavailable"] = f"no per-container CPU limits here: {cluster.cgroups.reason}"
        return
    declared = planner_on_workflow(cluster, None)
    stack = ClusterStack(cluster, token, demo_workflow())
    said: list[str] = []
    ctx = DemoContext(home=cluster.workdir / "demo", tracking_uri="http://mlflow:5000", quick=True,
                      say=said.append, stack=stack, world_drifted=world_drifted)
    ctx.home.mkdir(parents=True, exist_ok=True)
    for name, run in (("s2", s2_autoscale.run), ("s3", s3_tune.run)):
        if name not in scenarios:
            continue
        t0 = time.monotonic()
        res = run(ctx)
        result[name] = {"passed": res.passed, "error": res.error, "figures": res.figures,
                        "decisions": res.decisions[:30], "said": said[-40:], "seconds": round(time.monotonic() - t0, 1)}
        said.clear()
    result["tuning_replica_limits"] = replica_limits(cluster)
    planner_on_workflow(cluster, declared)  # the scenarios after these run on the declared workflow again


def replica_limits(cluster: Cluster) -> dict[str, dict[str, float | None]]:
    """Each running digits pod's replica CPU limit as its status reports it (what the Executor reads
    back) and as its container's cgroup holds it (what the process is held to)."""
    from scanflow.platform.k8s_resources import normalise

    out: dict[str, dict[str, float | None]] = {}
    for pod in cluster._owned("Deployment", "digits"):
        obj = cluster.get("v1", "Pod", pod.name) or {}
        status = next((c for c in (obj.get("status") or {}).get("containerStatuses") or []
                       if c.get("name") == "replica"), {})
        cpu = ((status.get("resources") or {}).get("limits") or {}).get("cpu")
        out[pod.name] = {"status": None if cpu is None else normalise("cpu", cpu),
                         "cgroup": cluster.cgroups.limit(pod.name, "replica")}
    return out
