"""The image-bump scenario on the emulated cluster (an emulation: the kubelet runs the checkout's code
whatever the image's name says; what is checked is what the API shows and what the clients get).

An operator bumps the image in configuration (kustomize's `images:`); the Executor takes its pods' image
from its own pod, so bumping the Executor's Deployment is the bump it sees. Its new pod adopts the running
replicas (replicas and resources kept), finds them on the old image and rolls each service onto the new
one (surge 1, unavailable 0) as a decision of its `execute-upgrade` strategy. Traffic goes through the
gateway all along; every request must be answered."""

from __future__ import annotations

import time
from typing import Any

import httpx

from . import model
from .cluster import Cluster
from .waiting import svc, wait_for

MANAGED_BY = "scanflow-executor"


def bumped(image: str) -> str:
    """The same repository under another tag (a digest or a registry port are not a tag)."""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}:harness-upgrade"


def managed_services(cluster: Cluster) -> list[str]:
    return sorted(d["metadata"]["name"] for d in cluster.list("apps/v1", "Deployment")
                  if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == MANAGED_BY)


def replica_state(cluster: Cluster, name: str) -> dict[str, Any]:
    """What adoption must keep (replicas, resources) and what the upgrade must change (the image)."""
    dep = cluster.get("apps/v1", "Deployment", name) or {}
    container = dep["spec"]["template"]["spec"]["containers"][0]
    return {"replicas": int(dep["spec"].get("replicas", 1)), "resources": container.get("resources"),
            "image": container.get("image")}


def rolled_onto(cluster: Cluster, name: str, image: str) -> bool:
    """Every pod of the service on the current template, ready, and that template on `image`."""
    dep = cluster.get("apps/v1", "Deployment", name) or {}
    template = dep["spec"]["template"]
    if template["spec"]["containers"][0].get("image") != image:
        return False
    pods = cluster._owned("Deployment", name)
    return len(pods) == int(dep["spec"].get("replicas", 1)) and all(
        p.ready and p.hash == model.template_hash(template) for p in pods)


def at_resized_size(cluster: Cluster, name: str) -> bool | None:
    """Every pod of the service runs (its status says) the size of an earlier in-place resize, which the
    Executor's reconcile brings new pods to; None when the service was never resized in place."""
    from scanflow.platform import manifests as mf
    from scanflow.platform.k8s_resize import same_resources

    resized = mf.resized_to(cluster.get("apps/v1", "Deployment", name) or {})
    if resized is None:
        return None
    for pod in cluster._owned("Deployment", name):
        obj = cluster.get("v1", "Pod", pod.name) or {}
        status = next((c for c in (obj.get("status") or {}).get("containerStatuses") or []
                       if c.get("name") == mf.REPLICA_CONTAINER), {})
        if not same_resources(status.get("resources") or {}, resized[0]):
            return False
    return True


def run_upgrade(cluster: Cluster, gateway: str, token: str, result: dict[str, Any]) -> None:
    from scanflow.examples.digits.s1 import traffic_pools

    from scanflow.embedded.traffic import Traffic

    services = managed_services(cluster)
    before = {s: replica_state(cluster, s) for s in services}
    executor = cluster.get("apps/v1", "Deployment", "executor") or {}
    containers = executor["spec"]["template"]["spec"]["containers"]
    image = bumped(containers[0]["image"])
    result.update({"upgrade_services": services, "upgrade_image": image})
    pools = traffic_pools()
    with Traffic(gateway, pools["clean"], pools["clean"], rate=20, clients=2) as traffic:
        wait_for(lambda: traffic.count() > 20, 60, "traffic answered before the upgrade")
        t0 = time.monotonic()
        # a JSON merge patch replaces a list whole: the containers as they are, the first one's image bumped
        cluster._merge("apps/v1", "Deployment", "executor", {"spec": {"template": {"spec": {
            "containers": [{**containers[0], "image": image}, *containers[1:]]}}}})
        # measured quiet: the Executor back in ~30 s, then each pod of each service in turn
        wait_for(lambda: all(rolled_onto(cluster, s, image) for s in services), 600,
                 "every replica on the new image", interval_s=1)
        result["upgrade_s"] = round(time.monotonic() - t0, 1)
        # the rollout's pods start from the template; the reconcile resizes them in place (every 10 s)
        resized = [s for s in services if at_resized_size(cluster, s) is not None]
        result["upgrade_resized_services"] = resized
        try:
            wait_for(lambda: all(at_resized_size(cluster, s) for s in resized), 90, "new pods at the resized size")
            result["upgrade_pods_at_resized_size"] = True
        except TimeoutError:
            result["upgrade_pods_at_resized_size"] = False
        answered = traffic.count()
        wait_for(lambda: traffic.count() > answered + 20, 60, "traffic served after the upgrade")
    result["upgrade_requests"] = traffic.count()
    result["upgrade_failed"] = len(traffic.failed())
    result["upgrade_failed_samples"] = [str(a) for a in traffic.failed()[:5]]
    after = {s: replica_state(cluster, s) for s in services}
    result["upgrade_kept"] = {s: {k: after[s][k] == before[s][k] for k in ("replicas", "resources")} for s in services}

    def decided() -> list[dict[str, Any]] | None:
        rows = httpx.get(f"{svc(cluster, 'executor')}/decisions", params={"strategy": "execute-upgrade"},
                         headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        outcomes = [o for row in rows for o in (row.get("outcomes") or {}).values() if isinstance(o, dict)]
        return outcomes if len(outcomes) >= len(services) else None

    result["upgrade_outcomes"] = wait_for(decided, 60, "the Executor's upgrade decisions")
