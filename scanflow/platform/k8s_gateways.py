"""Kubernetes: a progressive delivery's challenger, set on every pod of the champion service's gateway.

Who calls: KubernetesPlatform.set_challenger (the Executor, at each step of a delivery and again at every
reconcile while the delivery runs: scanflow/standard/executor.py).

Why every pod, read from the API: the gateway (the Deployment `<service>-gateway` that kustomize owns; two
pods in the prod overlay) keeps its challenger in memory, and a call through its Service would reach one pod
only. The pods come from the API server (labels app.kubernetes.io/name=<service>-gateway and
component=gateway, Ready, with an IP), so neither DNS nor configuration is needed; each gets
`PUT`/`DELETE /admin/challenger` on its `http` port with the Executor's token (scope serving:admin). A pod
that starts later (a restart, a scale-up) gets the challenger at the Executor's next repeat of the call.
The challenger's URL is its ClusterIP Service (`<service>-challenger`, created by the Executor like any
service), which balances the gateway's calls over the challenger's replicas.
"""

from __future__ import annotations

from typing import Any

from scanflow.auth import bearer_header
from scanflow.platform import manifests as mf
from scanflow.platform import processes as procs
from scanflow.platform.base import PlatformError
from scanflow.platform.k8s_api import KubernetesNotFound

NAME_LABEL, COMPONENT_LABEL = "app.kubernetes.io/name", "app.kubernetes.io/component"


def gateway_name(service: str) -> str:
    """Pure: the name (and `app.kubernetes.io/name` label) of `service`'s gateway (deploy/base/inference.yaml)."""
    return f"{service}-gateway"


def gateway_pods(pods: list[dict[str, Any]], service: str) -> list[tuple[str, bool]]:
    """Pure: (base URL, Ready) of each pod of `service`'s gateway that has an IP and is not terminating (its
    container port named `http`, else the default port). The labels are checked here again: an emulator may
    ignore the selector."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(NAME_LABEL) != gateway_name(service) or labels.get(COMPONENT_LABEL) != "gateway":
            continue
        st = pod.get("status") or {}
        if meta.get("deletionTimestamp") or not st.get("podIP"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        port = next((p.get("containerPort") for p in ports if p.get("name") == "http"), mf.HTTP_PORT)
        host = st["podIP"]
        out.append((f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}", ready))
    return out


def set_on_gateways(plat: Any, service: str, challenger: str | None, mode: str, share: float,
                    delivery: str | None) -> list[str]:
    """Set the challenger on every Ready gateway pod of `service`, or (`challenger` None) take it off every
    gateway pod (a pod not Ready that cannot be reached is left: it gets no traffic, and a restart forgets it);
    returns the pods' URLs called. PlatformError: no gateway pod at all (not retryable: check the labels), none
    Ready or a pod refused (retryable: the Executor repeats the call, and a repeat changes nothing where it was
    applied), the token refused (not retryable: it needs the scope serving:admin)."""
    try:
        target = plat.status(challenger).endpoint if challenger is not None else None
    except KubernetesNotFound:
        raise PlatformError(f"challenger {challenger!r} of {service!r} is not deployed in namespace "
                            f"{plat.namespace!r}: deploy it before putting it on the gateway") from None
    selector = f"{NAME_LABEL}={gateway_name(service)},{COMPONENT_LABEL}=gateway"
    pods = plat._dict(plat._call("list", "pods", plat.core.list_namespaced_pod, plat.namespace,
                                 label_selector=selector)).get("items") or []
    found = gateway_pods(pods, service)
    if not found:
        raise PlatformError(f"{service!r}: no pod of its gateway ({selector}) in namespace {plat.namespace!r}: "
                            "a progressive delivery needs the gateway of deploy/base/inference.yaml")
    targets = found if target is None else [(u, r) for u, r in found if r]
    if not targets:
        raise PlatformError(f"{service!r}: no Ready pod of its gateway ({selector}): the challenger cannot be set "
                            "now", retryable=True)
    headers = bearer_header(plat.gateway_token)
    body = None if target is None else {"url": target, "mode": mode, "share": share, "service": challenger,
                                        "delivery": delivery}
    failed, refused = [], False
    for url, ready in targets:
        try:
            if body is None:
                procs.call("DELETE", f"{url}/admin/challenger", headers=headers, retries=1)
            else:
                procs.call("PUT", f"{url}/admin/challenger", json=body, headers=headers, retries=1)
        except procs.HttpError as exc:
            refused |= exc.status in (401, 403)
            if ready or exc.status is not None:
                failed.append(f"{url}: {exc}")
    if failed:
        hint = " (the Executor's token needs the scope serving:admin)" if refused else ""
        raise PlatformError(f"{service!r}: the challenger not {'set' if body else 'taken off'} on {len(failed)} of "
                            f"{len(targets)} gateway pods{hint}: " + "; ".join(failed), retryable=not refused)
    return [u for u, _ in targets]
