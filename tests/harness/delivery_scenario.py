"""S1 with a progressive delivery on the emulated cluster (scenario `delivery`, beside `s1`), run by hand:
`unshare -m -n python -m tests.harness --overlay prod --scenarios wired,s4,s1,delivery --workdir W --out R.json`.

Not in the e2e set: on this emulation every pod shares the machine's cores, so the shadow's doubled serving
work raises the champion's latency during S1, the Planner scales `digits` up, and S2 then starts from two
replicas and fails its no-flap verdict (seen once in CI, 2026-11-29). On a cluster the challenger has its
own pods.

The agents get the digits workflow with `delivery: progressive` (short stages, as tests/e2e runs it) from a
ConfigMap instead of the image's workflow.yaml: the manifests are otherwise the overlay's. During S1 the
harness reads every gateway pod's `/admin/state` (at the pod's own address) and the Deployments in the API,
so the result says whether the Executor created the challenger's Deployment and put the challenger on each
gateway pod under one delivery id, and how the Planner's stages went.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import httpx

from .cluster import Cluster
from .waiting import svc, wait_for

MOUNT = "/etc/scanflow-workflow"
CONFIGMAP = "digits-workflow-delivery"
# latency_tolerance: not judged here. The emulated kube-proxy is a userspace forwarder in the harness's own
# process, so a call through a Service address (the challenger's) takes longer than a cluster's would, while
# the gateway reaches the champion's pods directly; tests/e2e judges latency on real processes.
LATENCY_TOLERANCE = 100.0
STAGES = [{"kind": "shadow", "share": 1.0, "min_labelled": 100, "min_seconds": 10, "timeout_s": 300},
          {"kind": "canary", "share": 0.3, "min_labelled": 20, "min_seconds": 10, "timeout_s": 300}]


def delivery_workflow_yaml() -> str:
    """The shipped digits workflow, its `digits` service declaring a progressive delivery."""
    from scanflow.examples.digits.workflow import workflow

    from scanflow.spec import Delivery

    delivery = Delivery.model_validate({"mode": "progressive", "stages": STAGES, "latency_tolerance": LATENCY_TOLERANCE})
    services = [s.model_copy(update={"delivery": delivery}) if s.name == "digits" else s for s in workflow.services]
    return str(workflow.model_copy(update={"services": services}).to_yaml())


def with_delivery(docs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The rendered manifests with every agent reading the delivery workflow from a ConfigMap."""
    out = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIGMAP, "namespace": namespace},
            "data": {"workflow.yaml": delivery_workflow_yaml()}}]
    for d in docs:
        labels = ((d.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
        if d["kind"] != "Deployment" or labels.get("app.kubernetes.io/component") != "agent":
            out.append(d)
            continue
        d = copy.deepcopy(d)
        pod = d["spec"]["template"]["spec"]
        pod.setdefault("volumes", []).append({"name": "workflow", "configMap": {"name": CONFIGMAP}})
        for c in pod["containers"]:
            c.setdefault("volumeMounts", []).append({"name": "workflow", "mountPath": MOUNT, "readOnly": True})
            for e in c.get("env") or []:
                if e["name"] == "SCANFLOW_WORKFLOW":
                    e["value"] = f"{MOUNT}/workflow.yaml"
        out.append(d)
    return out


class DeliveryWatch:
    """Polled during S1: what the gateway pods and the API show of the delivery."""

    def __init__(self, cluster: Cluster, token: str) -> None:
        self.cluster, self.token = cluster, token
        self.by_gateway: dict[str, set[str]] = {}  # gateway pod -> delivery ids seen on it
        self.modes: set[str] = set()
        self.challenger_deployment = False

    def poll(self) -> None:
        for pod in self.cluster.list("v1", "Pod"):
            if (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name") != "digits-gateway":
                continue
            ip = (pod.get("status") or {}).get("podIP")
            try:
                ch = httpx.get(f"http://{ip}:8080/admin/state", timeout=5).json().get("challenger") if ip else None
            except httpx.HTTPError:
                continue
            if ch:
                self.by_gateway.setdefault(pod["metadata"]["name"], set()).add(str(ch.get("delivery")))
                self.modes.add(str(ch.get("mode")))
        self.challenger_deployment |= self.cluster.get("apps/v1", "Deployment", "digits-challenger") is not None

    def report(self, result: dict[str, Any]) -> None:
        plans = httpx.get(svc(self.cluster, "planner") + "/plans", timeout=30,
                          headers={"Authorization": f"Bearer {self.token}"}).json()
        stages = [p for p in plans if p.get("policy") == "delivery"]
        result["delivery_actions"] = [p.get("action") for p in stages]
        result["delivery_reasons"] = [p.get("reason") for p in stages]
        result["delivery_stage_kinds"] = [(p.get("inputs") or {}).get("stage_kind") for p in stages]
        result["delivery_ids_by_gateway"] = {k: sorted(v) for k, v in self.by_gateway.items()}
        result["delivery_gateway_pods"] = sorted(p["metadata"]["name"] for p in self.cluster.list("v1", "Pod")
                                                 if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
                                                 == "digits-gateway")
        result["delivery_modes_seen"] = sorted(self.modes)
        result["delivery_challenger_deployment"] = self.challenger_deployment
        try:  # the promotion swaps every service first, then removes the challenger
            wait_for(lambda: self.cluster.get("apps/v1", "Deployment", "digits-challenger") is None, 120,
                     "the challenger's Deployment removed")
            result["delivery_challenger_left"] = False
        except TimeoutError:
            result["delivery_challenger_left"] = True


def s1_with_delivery(run_s1: Callable[..., None], gateway: str, token: str, cluster: Cluster,
                     result: dict[str, Any]) -> None:
    """S1 (tests/harness/__main__.py run_s1) with the gateways and the API read on each of its polls; what the
    delivery did goes into `result` whether S1 ended or not."""
    watch = DeliveryWatch(cluster, token)
    try:
        run_s1(gateway, token, result, during=watch.poll)
    finally:
        watch.report(result)
