"""Changing a Kubernetes service's CPU and memory: in place (pods/resize) where it can, else by rolling.

`resize_service` (KubernetesPlatform.set_resources) reads the Deployment, picks the method
(k8s_resources.choose_resize_method), patches every pod's `resize` subresource and waits until the
kubelet applied it (`resize_pods`, which says why to roll the pods instead when it cannot). An
in-place resize leaves the pod template alone (a template change is a rollout that would replace the
pods just resized): the size goes into the Deployment's RESIZED_ANNOTATION, and `reconcile_resized`
resizes pods created later as they appear, as VPA's in-place updater does. A rolling update (or
`sync_template_after_resize`, an operator's choice) writes the template (`template_patch`: resources,
thread env, placement). `resources_patch`
turns a container's `resources` into the wanted ones (keys no longer wanted become null), and
`wanted_resources` is what a pod's status must show afterwards (scanflow.platform.readback). Separate
from `KubernetesPlatform` (which passes itself in for its API calls) because the resize is the one
operation that acts on pods one by one and waits on the kubelet.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from scanflow.platform import manifests as mf
from scanflow.platform.base import PlatformError, ResourceChange
from scanflow.platform.k8s_api import MERGE_PATCH, STRATEGIC_PATCH, KubernetesInvalid, KubernetesNotFound
from scanflow.platform.k8s_resources import (
    ResizePlan,
    choose_resize_method,
    default_threads,
    normalise,
    resources_block,
)
from scanflow.platform.readback import Wanted
from scanflow.spec import Affinity, Resources, parse_memory

if TYPE_CHECKING:
    from scanflow.platform.kubernetes import KubernetesPlatform

log = logging.getLogger(__name__)


class ResizeLocks:
    """One lock per service, held by a resize of it in this process. Why: `resize_service` writes the
    service's size annotation only once its pods took the new size, and `reconcile_resized` resizes
    pods to that annotation; a reconcile in between asked the freshly resized pods back to the old
    size (the emulated cluster showed it). So a reconcile skips a service that is being resized."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def of(self, service: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(service, threading.Lock())


def resize_service(
    plat: KubernetesPlatform, service: str, resources: Resources, affinity: Affinity | None = None,
    threads: int | None = None,
) -> ResourceChange:
    """`KubernetesPlatform.set_resources`: resize in place where the cluster allows it, else roll the
    pods (maxUnavailable 0); one resize of a service at a time (ResizeLocks)."""
    with plat.resizing.of(service):
        return _resize_service(plat, service, resources, affinity, threads)


def _resize_service(
    plat: KubernetesPlatform, service: str, resources: Resources, affinity: Affinity | None,
    threads: int | None,
) -> ResourceChange:
    dep = plat._read_deployment(service)
    tmpl = (dep.get("spec") or {}).get("template") or {}
    pod_spec = tmpl.get("spec") or {}
    container = next((c for c in pod_spec.get("containers") or [] if c.get("name") == mf.REPLICA_CONTAINER),
                     None)
    if container is None:
        raise PlatformError(f"deployment {service!r} has no container {mf.REPLICA_CONTAINER!r}: not a "
                            "scanflow service")
    current_policy = ((tmpl.get("metadata") or {}).get("annotations") or {}).get(mf.AFFINITY_ANNOTATION, "none")
    aff = affinity or Affinity(policy=current_policy)  # type: ignore[arg-type]
    current_res = container.get("resources") or {}
    desired_res = resources_block(resources, aff)
    want_placement = mf.placement(service, aff)
    placement_changed = affinity is not None and (
        pod_spec.get("affinity") != want_placement.get("affinity")
        or pod_spec.get("topologySpreadConstraints") != want_placement.get("topologySpreadConstraints")
    )
    n_threads = threads or default_threads(resources)
    plan = choose_resize_method(plat.server_version(), current_res, desired_res, current_policy,
                                aff.policy, placement_changed)
    applied = {"resources": desired_res, "affinity": aff.policy, "threads": n_threads}
    notes = [plan.reason]
    if plan.method == "in-place":
        fallback = resize_pods(plat, service, current_res, desired_res, notes)
        if fallback:
            plan = ResizePlan("rolling-update", fallback)
            notes.append(fallback)
        elif plat.sync_template_after_resize:
            notes.append("Deployment template brought in line (sync_template_after_resize): a rollout "
                         "replaces the pods just resized")
    if plan.method == "in-place" and not plat.sync_template_after_resize:
        # the template stays: patching it would start a rollout replacing the pods just resized. The
        # size goes into an annotation of the Deployment itself, and pods created later (scale-up,
        # restarts) are resized to it as they appear (reconcile_resized, the Executor's sensor)
        plat._patch_deployment(service, {"metadata": {"annotations": {mf.RESIZED_ANNOTATION: json.dumps(
            {"resources": desired_res, "threads": n_threads}, sort_keys=True)}}})
        notes.append(f"no rollout: the size is kept in the Deployment's {mf.RESIZED_ANNOTATION} annotation, "
                     "and pods started later are resized to it in place")
        return ResourceChange(service, "in-place", applied, tuple(notes), wanted_resources(desired_res, None))
    body = template_patch(service, current_res, desired_res, aff, want_placement, pod_spec, n_threads)
    # the template now says what the pods run: an earlier in-place size no longer stands beside it
    body["metadata"] = {"annotations": {mf.RESIZED_ANNOTATION: None}}
    plat._patch_deployment(service, body)
    if plan.method == "rolling-update":
        try:
            plat._wait_ready(service)
        except PlatformError as exc:
            _roll_back_if_unschedulable(plat, service, dep, exc, notes)
    # a rolled pod starts with the new SCANFLOW_THREADS; one resized in place keeps its env (its
    # replica follows the new CPU limit by itself), so its threads are not checked
    return ResourceChange(service, plan.method, applied, tuple(notes),
                          wanted_resources(desired_res, n_threads if plan.method == "rolling-update" else None))


def resize_body(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Pure: the `pods/resize` patch that takes a pod's replica container from `current` to `desired`."""
    return {"spec": {"containers": [{"name": mf.REPLICA_CONTAINER, "resources": resources_patch(current, desired)}]}}


def resources_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """A `resources` patch that turns `current` into `desired`: keys no longer wanted become null."""
    out: dict[str, Any] = {}
    for section in ("requests", "limits"):
        cur = dict(current.get(section) or {})
        want = dict(desired.get(section) or {})
        patch: dict[str, Any] = dict(want)
        for key in cur:
            if key not in want:
                patch[key] = None
        if patch:
            out[section] = patch
    return out


def wanted_resources(desired: dict[str, Any], threads: int | None) -> Wanted:
    """Pure: what a pod's status must show once `desired` (a container `resources` block) took effect:
    its CPU limit (None: a Burstable pod has none) and memory limit, as the kubelet reports them in
    status.containerStatuses[].resources."""
    limits = desired.get("limits") or {}
    return Wanted(cpu_quota=normalise("cpu", limits["cpu"]) if "cpu" in limits else None,
                  memory_limit=parse_memory(str(limits["memory"])) if "memory" in limits else None,
                  threads=threads)


def template_patch(
    service: str, current_res: dict[str, Any], desired_res: dict[str, Any], aff: Affinity,
    want_placement: dict[str, Any], pod_spec: dict[str, Any], threads: int,
) -> dict[str, Any]:
    """Strategic merge patch of the pod template: resources, thread env, placement, annotation."""
    spec: dict[str, Any] = {
        "containers": [{
            "name": mf.REPLICA_CONTAINER,
            "resources": resources_patch(current_res, desired_res),
            "env": [{"name": "SCANFLOW_THREADS", "value": str(threads)},
                    {"name": "OMP_NUM_THREADS", "value": str(threads)}],
        }],
    }
    for key in ("affinity", "topologySpreadConstraints"):
        if key in want_placement:
            spec[key] = want_placement[key]
        elif key in pod_spec:
            spec[key] = None  # delete: placement no longer wanted
    return {
        "spec": {
            "strategy": mf.rolling_strategy(),
            "template": {"metadata": {"annotations": {mf.AFFINITY_ANNOTATION: aff.policy}}, "spec": spec},
        }
    }


def resize_pods(
    plat: KubernetesPlatform, service: str, current: dict[str, Any], desired: dict[str, Any], notes: list[str]
) -> str | None:
    """Patch every pod's `resize` subresource and wait for it; return a reason to fall back, or None."""
    body = resize_body(current, desired)
    pods = [p for p in plat._pods(service) if not (p.get("metadata") or {}).get("deletionTimestamp")]
    for pod in pods:
        name = pod["metadata"]["name"]
        try:
            plat._call("patch", "pods/resize", plat.core.patch_namespaced_pod_resize, name, plat.namespace,
                       body, _content_type=STRATEGIC_PATCH)
        except (KubernetesInvalid, KubernetesNotFound) as exc:
            if isinstance(exc, KubernetesNotFound) and "pods/resize" not in str(exc):
                continue  # the pod went away meanwhile
            return f"in-place resize refused on pod {name!r}: {exc}; falling back to a rolling update"
    deadline = time.monotonic() + plat.resize_timeout_s
    pending = {p["metadata"]["name"] for p in pods}
    while pending:
        for name in sorted(pending):
            try:
                pod = plat._dict(plat._call("get", "pods", plat.core.read_namespaced_pod, name, plat.namespace))
            except KubernetesNotFound:
                pending.discard(name)
                continue
            conds = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []
                     if c.get("status") == "True"}
            waiting = conds.get("PodResizePending")
            if waiting is not None and waiting.get("reason") == "Infeasible":
                # the kubelet never applies it; put every pod's spec back so none stays asking for it
                _resize_back(plat, pods, desired)
                return (f"pod {name!r}: resize infeasible on its node ({waiting.get('message', '')}); "
                        "falling back to a rolling update")
            if waiting is None and "PodResizeInProgress" not in conds and _allocated(pod, desired) is not False:
                pending.discard(name)
        if not pending:
            break
        if time.monotonic() > deadline:
            # not done is not success: the caller reports the plan as failed (and may try again)
            # instead of a resize the pods do not have; nothing else was changed yet
            raise PlatformError(
                f"in-place resize of {service!r} still pending after {plat.resize_timeout_s:.0f}s on pods "
                f"{sorted(pending)} (PodResizePending / PodResizeInProgress); the Deployment was not changed",
                retryable=True)
        time.sleep(plat.poll_interval_s)
    notes.append(f"resized {len(pods)} pod(s) in place")
    return None


def _allocated(pod: dict[str, Any], desired: dict[str, Any]) -> bool | None:
    """Pure: whether the kubelet reports the replica container running with `desired`
    (status.containerStatuses[].resources); None when it reports no resources. Why both this and the
    conditions: right after the patch, before the kubelet has seen it, a pod shows neither
    PodResizePending nor PodResizeInProgress, which must not read as done."""
    status = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                   if c.get("name") == mf.REPLICA_CONTAINER), None)
    res = (status or {}).get("resources")
    return None if res is None else same_resources(res, desired)


def _resize_back(plat: KubernetesPlatform, pods: list[dict[str, Any]], desired: dict[str, Any]) -> None:
    """Ask each of `pods` (as read before the resize) back to its own earlier resources after an
    Infeasible resize, which may differ from the template's after an earlier in-place resize (best
    effort: a pod that refuses keeps its allocation anyway, only its spec says otherwise)."""
    for pod in pods:
        mine = next((c.get("resources") or {} for c in (pod.get("spec") or {}).get("containers") or []
                     if c.get("name") == mf.REPLICA_CONTAINER), None)
        if mine is None:
            continue
        body = resize_body(desired, mine)
        try:
            plat._call("patch", "pods/resize", plat.core.patch_namespaced_pod_resize, pod["metadata"]["name"],
                       plat.namespace, body, _content_type=STRATEGIC_PATCH)
        except Exception as exc:  # noqa: BLE001 - best effort, said in the log
            log.warning("pod %s: could not put the infeasible resize back: %s", pod["metadata"]["name"], exc)


def unschedulable(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pure: (name, the scheduler's message) of each live pod the scheduler could not place
    (PodScheduled False, reason Unschedulable)."""
    out = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                out.append((pod["metadata"]["name"], str(c.get("message") or "")))
    return out


def rollback_patch(template: dict[str, Any], resized: str | None) -> dict[str, Any]:
    """Pure: a JSON merge patch that puts a Deployment's pod template back to `template` in what
    `template_patch` changes (the containers, wholesale, with their resources and thread env; the
    placement; the affinity annotation), and its RESIZED_ANNOTATION back to `resized`. Keys the
    template did not have become null (deleted)."""
    spec = template.get("spec") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    return {
        "metadata": {"annotations": {mf.RESIZED_ANNOTATION: resized}},
        "spec": {"template": {
            "metadata": {"annotations": {mf.AFFINITY_ANNOTATION: annotations.get(mf.AFFINITY_ANNOTATION)}},
            "spec": {"containers": spec.get("containers"), "affinity": spec.get("affinity"),
                     "topologySpreadConstraints": spec.get("topologySpreadConstraints")},
        }},
    }


def _roll_back_if_unschedulable(plat: KubernetesPlatform, service: str, dep: dict[str, Any],
                                exc: PlatformError, notes: list[str]) -> None:
    """A rolling update of `service` that did not complete: when the scheduler cannot place its new
    pods (no node has room for the new size), put the template back as it was in `dep` and say so
    (not retryable: the same size would not fit again); otherwise re-raise `exc` as it is."""
    stuck = unschedulable(plat._pods(service))
    if not stuck:
        raise exc
    template = (dep.get("spec") or {}).get("template") or {}
    resized = ((dep.get("metadata") or {}).get("annotations") or {}).get(mf.RESIZED_ANNOTATION)
    plat._call("patch", "deployments", plat.apps.patch_namespaced_deployment, service, plat.namespace,
               rollback_patch(template, resized), _content_type=MERGE_PATCH, field_manager=plat.field_manager)
    name, message = stuck[0]
    raise PlatformError(
        f"{service!r}: the new size cannot be scheduled (pod {name!r} Unschedulable: {message}); the "
        f"Deployment's template was put back as it was, and its running pods kept their size. "
        + "; ".join(n for n in notes if n), retryable=False) from exc


THREAD_ENV = ("SCANFLOW_THREADS", "OMP_NUM_THREADS")


def apply_after_resize(manifest: dict[str, Any], existing: dict[str, Any] | None
                       ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Pure: the Deployment `manifest` a (re)deploy applies, reconciled with an in-place resize of the
    running one (RESIZED_ANNOTATION). Returns (manifest to apply, the annotations patch to make
    first, or None when the annotation stays as it is).

    - The manifest asks for the size the pods were resized to (a restarted Executor adopts that size):
      its replica container keeps the running template's resources and thread env, so the apply
      changes nothing and starts no rollout that would replace the pods just resized; the annotation
      goes on resizing pods started later.
    - It asks for the template's own size: the template stays, so no rollout replaces the resized
      pods either; the annotation now names that size, and the reconcile resizes the pods to it in place.
    - It asks for another size: the template changes (a rollout) and says what the new pods run; the
      annotation goes, else they would be resized back to the stale size."""
    resized = mf.resized_to(existing) if existing is not None else None
    if resized is None:
        return manifest, None
    desired, threads = resized
    drop = {mf.RESIZED_ANNOTATION: None}

    def replica(dep: dict[str, Any]) -> dict[str, Any] | None:
        containers = (((dep.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        return next((c for c in containers if c.get("name") == mf.REPLICA_CONTAINER), None)

    new, old = replica(manifest), replica(existing or {})
    if new is None or old is None:
        return manifest, drop
    env = {e.get("name"): e.get("value") for e in new.get("env") or []}
    new_res = new.get("resources") or {}
    if same_resources(new_res, desired) and (threads is None or env.get("SCANFLOW_THREADS") == str(threads)):
        old_env = {e.get("name"): e.get("value") for e in old.get("env") or []}
        kept = json.loads(json.dumps(manifest))  # a copy: the caller's manifest stays as built
        container = replica(kept)
        assert container is not None
        container["resources"] = old.get("resources") or {}
        container["env"] = [{**e, "value": old_env[e["name"]]} if e.get("name") in THREAD_ENV
                            and e.get("name") in old_env else e for e in container.get("env") or []]
        return kept, None
    if same_resources(new_res, old.get("resources") or {}):
        n_threads = str(env.get("SCANFLOW_THREADS"))
        return manifest, {mf.RESIZED_ANNOTATION: json.dumps(
            {"resources": new_res, "threads": int(n_threads) if n_threads.isdigit() else None}, sort_keys=True)}
    return manifest, drop


def same_resources(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Pure: two container `resources` blocks ask the same (quantities compared by value: "1" == "1000m")."""
    def values(res: dict[str, Any]) -> dict[tuple[str, str], float]:
        return {(section, k): normalise(k, v) for section in ("requests", "limits")
                for k, v in (res.get(section) or {}).items() if v is not None}
    return values(a) == values(b)


def reconcile_resized(plat: KubernetesPlatform, service: str) -> list[str]:
    """Resize in place every live pod of `service` whose replica container differs from the size its
    Deployment was resized to (RESIZED_ANNOTATION; none: nothing to do). Returns the pods asked. A pod
    that refuses is logged and asked again on the next call; the kubelet's progress shows in the pod's
    status (the Executor's GET /services). Nothing while a resize of the service is in flight
    (ResizeLocks): the next call does it."""
    lock = plat.resizing.of(service)
    if not lock.acquire(blocking=False):
        return []
    try:
        return _reconcile_resized(plat, service)
    finally:
        lock.release()


def _reconcile_resized(plat: KubernetesPlatform, service: str) -> list[str]:
    resized = mf.resized_to(plat._read_deployment(service))
    if resized is None:
        return []
    desired, _threads = resized
    asked = []
    for pod in plat._pods(service):
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        container = next((c for c in (pod.get("spec") or {}).get("containers") or []
                          if c.get("name") == mf.REPLICA_CONTAINER), None)
        if container is None or same_resources(container.get("resources") or {}, desired):
            continue
        body = resize_body(container.get("resources") or {}, desired)
        try:
            plat._call("patch", "pods/resize", plat.core.patch_namespaced_pod_resize, meta["name"], plat.namespace,
                       body, _content_type=STRATEGIC_PATCH)
        except (KubernetesInvalid, KubernetesNotFound) as exc:
            log.warning("pod %s of %s: in-place resize to the service's size refused: %s", meta["name"], service, exc)
            continue
        asked.append(str(meta["name"]))
    return asked
