"""KubernetesPlatform driven through the official client against kmock on loopback.

kmock applies every patch as a plain JSON merge and runs no controllers, so these tests check two
things: the state kmock ends up with, and the exact requests (path, verb, patch content type, body)
that a real API server needs; strategic-merge semantics are asserted on the request only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kmock
import pytest

from scanflow.platform.base import PlatformError
from scanflow.platform.jobruns import jobs_experiment
from scanflow.platform.k8s_api import KubernetesForbidden, KubernetesNotFound
from scanflow.platform.kubernetes import KubernetesPlatform
from scanflow.spec import Affinity, Job, Resources, Service

NS = "scanflow"
HERE = Path(__file__).parent
DEP = "/apis/apps/v1/namespaces/scanflow/deployments"
SVC = "/api/v1/namespaces/scanflow/services"
MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"

PRIMARY = Service(name="digits", model_uri="models:/digits@champion", replicas=2,
                  resources=Resources(cpu=1.5, memory="512Mi"), backup="digits-backup")
BACKUP = Service(name="digits-backup", model_uri="models:/digits@champion", replicas=1)


def stored(km: Any, group_version_plural: str, name: str) -> dict[str, Any]:
    res = km.emulator.resources  # noqa: F841  (kept for readers: objects are keyed by resource)
    for (resource, ns, obj_name), obj in km.emulator.objects.items():
        if f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/") == group_version_plural \
                and ns == NS and obj_name == name and not obj.deleted:
            return dict(obj.raw)
    raise KeyError(name)


def add_pod(plat: KubernetesPlatform, name: str, service: str, *, cpu: str = "1500m",
            conditions: list[dict[str, str]] | None = None, cpu_limit: str | None = None) -> None:
    limits = {"memory": "512Mi", **({"cpu": cpu_limit} if cpu_limit else {})}
    plat.core.create_namespaced_pod(NS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"scanflow.io/service": service}},
        "spec": {"containers": [{"name": "replica", "image": "scanflow:0.1.0",
                                 "resources": {"requests": {"cpu": cpu, "memory": "512Mi"},
                                               "limits": limits}}]},
        "status": {"podIP": "10.0.0.7", "conditions": [{"type": "Ready", "status": "True"},
                                                       *(conditions or [])]},
    })


APPLY = "application/apply-patch+yaml"


def test_deploy_applies_server_side_as_the_executor_then_again_idempotently(kmock_server, make_platform):
    plat = make_platform()
    st = plat.deploy(PRIMARY)
    writes = [(m, p, ct if m == "PATCH" else None) for m, p, ct in kmock_server.calls() if m in ("PATCH", "POST")]
    # server-side apply first (an API server creates on apply; kmock answers 404, so the platform creates)
    assert writes[:2] == [("PATCH", f"{DEP}/digits", APPLY), ("POST", DEP, None)]
    applies = [r for r in kmock_server.requests() if r.method.value in ("PATCH", "POST")]
    assert all(r.url.query.get("fieldManager") == "scanflow-executor" for r in applies)
    assert all(r.url.query.get("force") == "true" for r in applies if r.method.value == "PATCH")
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scanflow-executor"
    assert container["resizePolicy"][0] == {"resourceName": "cpu", "restartPolicy": "NotRequired"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert st.routed_to == "digits" and st.desired_replicas == 2

    kmock_server.mark()
    plat.deploy(PRIMARY)  # second time: one apply each, no create
    calls = kmock_server.calls()
    assert ("PATCH", f"{DEP}/digits", APPLY) in calls and ("PATCH", f"{SVC}/digits", APPLY) in calls
    assert not [c for c in calls if c[0] == "POST"]
    dep_patch = next(r.data for r in kmock_server.requests() if r.url.path == f"{DEP}/digits"
                     and r.method.value == "PATCH")
    assert dep_patch["apiVersion"] == "apps/v1" and dep_patch["kind"] == "Deployment"  # a full apply config
    svc_patch = next(r.data for r in kmock_server.requests() if r.url.path == f"{SVC}/digits"
                     and r.method.value == "PATCH")
    assert "selector" not in svc_patch["spec"]  # a failover route survives a re-deploy


def test_scale_uses_scale_subresource_with_merge_patch(kmock_server, make_platform):
    plat = make_platform()
    plat.deploy(PRIMARY)
    kmock_server.mark()
    st = plat.scale("digits", 5)
    scale_req = [r for r in kmock_server.requests() if r.url.path.endswith("/scale")]
    assert [(r.method.value, r.url.path, r.headers["Content-Type"]) for r in scale_req] == [
        ("PATCH", f"{DEP}/digits/scale", MERGE)]
    assert scale_req[0].data == {"spec": {"replicas": 5}}
    assert stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["replicas"] == 5
    assert st.desired_replicas == 5 and st.notes == ()


def test_scale_moves_hpa_bounds_instead_of_fighting_it(kmock_server, make_platform):
    plat = make_platform()
    plat.deploy(PRIMARY)
    plat.autoscaling.create_namespaced_horizontal_pod_autoscaler(NS, {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "digits-hpa", "namespace": NS},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "digits"},
                 "minReplicas": 1, "maxReplicas": 10}})
    kmock_server.mark()
    st = plat.scale("digits", 4)
    paths = [p for _, p, _ in kmock_server.calls()]
    assert not any(p.endswith("/scale") for p in paths)
    hpa_patch = [r for r in kmock_server.requests() if r.method.value == "PATCH"]
    assert [(r.url.path, r.headers["Content-Type"], r.data) for r in hpa_patch] == [(
        "/apis/autoscaling/v2/namespaces/scanflow/horizontalpodautoscalers/digits-hpa", MERGE,
        {"spec": {"minReplicas": 4, "maxReplicas": 10}})]  # the Planner's floor; the HPA keeps its ceiling
    assert any("HPA 'digits-hpa'" in n and "[1, 10] to [4, 10]" in n for n in st.notes)
    kmock_server.mark()
    st = plat.scale("digits", 12)  # past the HPA's ceiling: the ceiling is its owner's, the HPA keeps one
    assert [r.data for r in kmock_server.requests() if r.method.value == "PATCH"] == [
        {"spec": {"minReplicas": 9, "maxReplicas": 10}}]
    assert any("[4, 10] to [9, 10]" in n and "asked for 12" in n for n in st.notes), st.notes
    with pytest.raises(PlatformError, match="cannot scale to 0"):
        plat.scale("digits", 0)


def test_resize_in_place_leaves_the_template_and_resizes_pods_started_later(kmock_server, make_platform):
    plat = make_platform(minor=34)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    add_pod(plat, "digits-b", "digits")
    add_pod(plat, "checker-a", "checker")  # another service's pod: never resized (kmock ignores selectors)
    template_before = stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["template"]
    kmock_server.mark()
    change = plat.set_resources("digits", Resources(cpu=1, memory="768Mi"))
    assert change.method == "in-place", change.notes
    resizes = [r for r in kmock_server.requests() if r.url.path.endswith("/resize")]
    assert sorted(r.url.path for r in resizes) == [
        "/api/v1/namespaces/scanflow/pods/digits-a/resize", "/api/v1/namespaces/scanflow/pods/digits-b/resize"]
    assert {r.headers["Content-Type"] for r in resizes} == {SMP}
    assert resizes[0].data == {"spec": {"containers": [{"name": "replica", "resources": {
        "requests": {"cpu": "1", "memory": "768Mi"}, "limits": {"cpu": "1", "memory": "768Mi"}}}]}}
    pod = stored(kmock_server, "v1/pods", "digits-a")
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    # no rollout: the pod template is not touched; the size goes into the Deployment's own annotation
    dep_patches = [r for r in kmock_server.requests() if r.url.path == f"{DEP}/digits" and r.method.value == "PATCH"]
    assert [set(r.data) for r in dep_patches] == [{"metadata"}], [r.data for r in dep_patches]
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert dep["spec"]["template"] == template_before
    assert any("no rollout" in n for n in change.notes), change.notes
    # what runs is the resized size: a restarted Executor adopts it, not the template's
    assert plat.services()["digits"].resources == Resources(cpu=1, memory="768Mi")
    # a restarted Executor applies what it adopted: the template stays as it was (a rollout would replace
    # the pods just resized, and pods started later are resized by the annotation, which stays)
    from scanflow.platform.adoption import adopt_running

    plat.deploy(adopt_running(PRIMARY, plat.services()["digits"]))
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert dep["spec"]["template"] == template_before
    assert json.loads(dep["metadata"]["annotations"]["scanflow.io/resized"])["resources"]["limits"]["cpu"] == "1"

    # a pod started later (a scale-up, a restart) comes from the template: the reconcile resizes it, only it
    add_pod(plat, "digits-c", "digits")
    kmock_server.mark()
    assert plat.reconcile_resized("digits") == ["digits-c"]
    resizes = [r for r in kmock_server.requests() if r.url.path.endswith("/resize")]
    assert [r.url.path for r in resizes] == ["/api/v1/namespaces/scanflow/pods/digits-c/resize"]
    assert resizes[0].data["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "768Mi"}
    assert plat.reconcile_resized("digits") == []  # every pod runs the size now
    plat.deploy(BACKUP)
    add_pod(plat, "digits-backup-a", "digits-backup")
    assert plat.reconcile_resized("digits-backup") == []  # never resized: its template stands

    # a deploy asking for another size: the template says it, and the annotation goes first (else pods
    # of the rollout would be resized back to the old in-place size)
    kmock_server.mark()
    plat.deploy(adopt_running(PRIMARY, plat.services()["digits"]).model_copy(
        update={"resources": Resources(cpu=0.5, memory="768Mi")}))
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert "scanflow.io/resized" not in (dep["metadata"].get("annotations") or {})
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"
    patches = [r for r in kmock_server.requests() if r.url.path == f"{DEP}/digits" and r.method.value == "PATCH"]
    assert patches[0].data == {"metadata": {"annotations": {"scanflow.io/resized": None}}}, [r.data for r in patches]
    # resized in place again, then a deploy asking the template's own size: no template change (no
    # rollout), so the running pods are brought back to it in place, by the annotation naming it now
    plat.set_resources("digits", Resources(cpu=1, memory="768Mi"))
    template_before = stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["template"]
    plat.deploy(adopt_running(PRIMARY, plat.services()["digits"]).model_copy(
        update={"resources": Resources(cpu=0.5, memory="768Mi")}))
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert dep["spec"]["template"] == template_before
    assert json.loads(dep["metadata"]["annotations"]["scanflow.io/resized"])["resources"]["limits"]["cpu"] == "500m"
    assert plat.services()["digits"].resources == Resources(cpu=0.5, memory="768Mi")
    assert sorted(plat.reconcile_resized("digits")) == ["digits-a", "digits-b", "digits-c"]
    plat.set_resources("digits", Resources(cpu=1, memory="768Mi"))  # in place again

    # a rolling update writes the template, and the annotation goes: the template says it again
    plat.set_resources("digits", Resources(cpu=2, memory="768Mi"), Affinity(policy="pinned"))
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert not (dep["metadata"].get("annotations") or {}).get("scanflow.io/resized")
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"


def test_the_template_follows_an_in_place_resize_only_when_the_operator_asks(kmock_server, make_platform):
    plat = make_platform(minor=34, sync_template_after_resize=True)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    kmock_server.mark()
    change = plat.set_resources("digits", Resources(cpu=1, memory="768Mi"))
    assert change.method == "in-place" and any("rollout" in n for n in change.notes), change.notes
    template_patch = [r for r in kmock_server.requests() if r.url.path == f"{DEP}/digits"
                      and r.method.value == "PATCH"]
    assert len(template_patch) == 1 and template_patch[0].headers["Content-Type"] == SMP
    c = template_patch[0].data["spec"]["template"]["spec"]["containers"][0]
    assert c["name"] == "replica" and c["resources"]["requests"]["cpu"] == "1"
    assert {"name": "SCANFLOW_THREADS", "value": "1"} in c["env"]
    # ordering: pods first, template after (new pods match what the old ones now run)
    order = [r.url.path for r in kmock_server.requests() if r.method.value == "PATCH"]
    assert order[-1] == f"{DEP}/digits"


def test_resize_falls_back_to_rolling_update_on_old_cluster(kmock_server, make_platform):
    plat = make_platform(minor=32)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    kmock_server.mark()
    change = plat.set_resources("digits", Resources(cpu=2, memory="512Mi"))
    assert change.method == "rolling-update" and "1.32 < 1.33" in change.notes[0]
    assert not any(p.endswith("/resize") for _, p, _ in kmock_server.calls())
    patch = next(r for r in kmock_server.requests() if r.method.value == "PATCH")
    assert patch.headers["Content-Type"] == SMP
    assert patch.data["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_pinned_means_guaranteed_integer_cpus_by_rolling_update(kmock_server, make_platform):
    plat = make_platform(minor=35)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    kmock_server.mark()
    aff = Affinity(policy="pinned", node_selector={"pool": "inference"}, spread_across_nodes=True)
    change = plat.set_resources("digits", Resources(cpu=1.5, memory="1Gi"), aff, threads=2)
    assert change.method == "rolling-update" and "static CPU manager" in change.notes[0]
    patch = next(r.data for r in kmock_server.requests() if r.method.value == "PATCH")
    spec = patch["spec"]["template"]["spec"]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"},
                                                  "limits": {"cpu": "2", "memory": "1Gi"}}
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"] == [{"key": "pool", "operator": "In", "values": ["inference"]}]
    assert spec["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert patch["spec"]["template"]["metadata"]["annotations"]["scanflow.io/affinity"] == "pinned"
    # pinned pods are never resized in place, even when QoS stays Guaranteed
    kmock_server.mark()
    again = plat.set_resources("digits", Resources(cpu=3, memory="1Gi"), aff)
    assert again.method == "rolling-update" and "static CPU manager" in again.notes[0]
    # back to none: the placement is deleted with nulls (strategic merge), QoS changes again.
    # kmock merges lists as plain JSON and would store the nulls inside the container list, which a
    # real server never returns: answer this one patch with a stub (kmock still records the request).
    kmock_server.emulator["patch", kmock.resource("apps", "v1", "deployments")] << {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "digits", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"scanflow.io/service": "digits"}}, "template": {}}}
    back = plat.set_resources("digits", Resources(cpu=1, memory="1Gi"), Affinity())
    last = [r.data for r in kmock_server.requests() if r.method.value == "PATCH"][-1]
    assert back.method == "rolling-update"
    assert last["spec"]["template"]["spec"]["affinity"] is None
    assert last["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "1Gi",
                                                                                         "cpu": "1"}


def test_infeasible_in_place_resize_falls_back(kmock_server, make_platform):
    plat = make_platform(minor=34)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits", conditions=[
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "Node didn't have enough capacity"}])
    change = plat.set_resources("digits", Resources(cpu=64, memory="512Mi"))
    assert change.method == "rolling-update"
    assert any("infeasible" in n for n in change.notes)


def test_a_pod_still_running_the_old_size_is_not_resized_yet(kmock_server, make_platform):
    """Right after the patch, before the kubelet has seen it, a pod shows no resize condition at all:
    its reported allocation (status.containerStatuses[].resources), still the old one, says not done."""
    plat = make_platform(minor=34)  # resize_timeout_s 2 (conftest)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    plat.core.patch_namespaced_pod_status("digits-a", NS, {"status": {"containerStatuses": [
        {"name": "replica", "ready": True, "restartCount": 0, "image": "scanflow:0.1.0", "imageID": "",
         "resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}}]}})
    with pytest.raises(PlatformError, match=r"still pending after 2s on pods \['digits-a'\]"):
        plat.set_resources("digits", Resources(cpu=2, memory="512Mi"))


def test_an_infeasible_resize_no_node_can_schedule_is_put_back_and_said(kmock_server, make_platform):
    """Infeasible in place, then the rolling update's new pod Unschedulable: the pods' resize is asked
    back, the template is put back as it was (merge patch), and the error says why, not retryable."""
    plat = make_platform(minor=34)
    plat.deploy(PRIMARY)
    plat.ready_timeout_s = 0.3  # kmock never completes a rollout: the wait times out at once
    # resized in place earlier: not the template's size (a CPU limit too: kmock would store a null for it)
    add_pod(plat, "digits-a", "digits", cpu="750m", cpu_limit="750m", conditions=[
        {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": "Node didn't have enough capacity"}])
    add_pod(plat, "digits-b", "digits", cpu_limit="1500m", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}])
    before = stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["template"]
    kmock_server.mark()
    with pytest.raises(PlatformError, match=r"pod 'digits-b' Unschedulable: 0/1 nodes are available") as err:
        plat.set_resources("digits", Resources(cpu=64, memory="512Mi"))
    assert not err.value.retryable and "infeasible" in str(err.value) and "put back" in str(err.value)
    patches = [r for r in kmock_server.requests() if r.method.value.upper() == "PATCH"]
    asked = [r for r in patches if r.url.path.endswith("/pods/digits-a/resize")]
    assert len(asked) == 2  # the resize, then back to the size this pod runs at (not the template's)
    assert asked[1].data["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "750m"
    assert before["spec"]["containers"][0]["resources"]["requests"]["cpu"] != "750m"
    last = patches[-1]
    assert last.url.path.endswith("/deployments/digits") and last.headers["Content-Type"] == MERGE
    after = stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["template"]
    assert after["spec"]["containers"] == before["spec"]["containers"]


def test_an_in_place_resize_still_pending_at_the_deadline_is_an_error_not_a_success(kmock_server, make_platform):
    plat = make_platform(minor=35)  # resize_timeout_s 2 (conftest)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits", conditions=[{"type": "PodResizeInProgress", "status": "True"}])
    kmock_server.mark()
    with pytest.raises(PlatformError, match=r"still pending after 2s on pods \['digits-a'\]") as err:
        plat.set_resources("digits", Resources(cpu=2, memory="512Mi"))
    assert err.value.retryable
    # the pod's resize was asked; the Deployment was not touched (no rollout behind a failed resize)
    changed = [p for m, p, _ in kmock_server.calls() if m == "PATCH"]
    assert any(p.endswith("/pods/digits-a/resize") for p in changed), changed
    assert not any("/deployments/" in p for p in changed), changed


def test_route_to_backup_and_back(kmock_server, make_platform):
    plat = make_platform()
    plat.deploy(PRIMARY)
    plat.deploy(BACKUP)
    kmock_server.mark()
    st = plat.route("digits", to="digits-backup")
    patch = next(r for r in kmock_server.requests() if r.method.value == "PATCH")
    assert (patch.url.path, patch.headers["Content-Type"]) == (f"{SVC}/digits", MERGE)
    assert patch.data["spec"] == {"selector": {"scanflow.io/service": "digits-backup"}}
    assert st.routed_to == "digits-backup"
    assert stored(kmock_server, "v1/services", "digits")["spec"]["selector"] == {"scanflow.io/service": "digits-backup"}
    assert plat.route("digits").routed_to == "digits"
    with pytest.raises(KubernetesNotFound, match="deployments"):
        plat.route("digits", to="nowhere")
    assert plat.status("digits").routed_to == "digits"


def test_forbidden_names_verb_and_resource(kmock_server, make_platform):
    plat = make_platform()
    plat.deploy(PRIMARY)
    kmock_server.emulator["patch", kmock.resource("apps", "v1", "deployments")] << 403
    with pytest.raises(KubernetesForbidden, match=r"lacks verb 'patch' on resource 'deployments/scale'"):
        plat.scale("digits", 3)


def test_unreachable_api_retries_a_bounded_number_of_times(kmock_server, make_platform):
    kmock_server.emulator["get /version/"] << 503
    plat = make_platform(retries=2)  # registered after the 503, so the 503 answers first
    with pytest.raises(PlatformError) as info:
        plat.set_resources("digits", Resources())
    assert info.value.retryable or "not found" in str(info.value)


def test_retries_on_503_are_bounded(kmock_server, make_platform):
    plat = make_platform(retries=2)
    kmock_server.emulator["get", re.compile(r".*/deployments/flaky$")] << 503
    kmock_server.mark()
    with pytest.raises(PlatformError) as info:
        plat.status("flaky")
    assert info.value.retryable
    assert [p for _, p, _ in kmock_server.calls()] == [f"{DEP}/flaky"] * 3


async def test_blocking_calls_refuse_a_running_event_loop(make_platform):
    plat = make_platform()
    with pytest.raises(RuntimeError, match="asyncio.to_thread"):
        plat.scale("digits", 2)


def _run_container(job: dict[str, Any]) -> int:
    """Play the kubelet for a Job's container: run its command (the real job runner) with the
    literal env values of the manifest (valueFrom entries have no Secret here) on this machine."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.update({e["name"]: e["value"] for e in container.get("env") or [] if "value" in e})
    argv = [sys.executable if a == "python" else a for a in container["command"]]
    return subprocess.run(argv, check=False, env=env, timeout=120, capture_output=True).returncode


def _complete_job_when_created(plat: KubernetesPlatform, *, succeed: bool, run: bool = False) -> threading.Thread:
    """Play the job controller: mark the first Job complete (or failed) and give it a pod; with
    `run`, first run its container for real (the outcome then decides the condition)."""

    def work() -> None:
        # run_job first opens its MLflow run (a fresh SQLite store: seconds on a loaded machine), so
        # the Job may appear late; a short deadline here left the test waiting for its own timeout.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            jobs = plat.batch.list_namespaced_job(NS).items
            if jobs:
                name = jobs[0].metadata.name
                ok = succeed
                if run:
                    ok = _run_container(plat.api_client.sanitize_for_serialization(jobs[0])) == 0
                add_job_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"{name}-x", "namespace": NS, "labels": {"batch.kubernetes.io/job-name": name}},
                    "spec": {"containers": [{"name": "job", "image": "x"}]}}
                plat.core.create_namespaced_pod(NS, add_job_pod)
                cond = {"type": "Complete" if ok else "Failed", "status": "True", "reason": "Done"}
                plat.batch.patch_namespaced_job_status(name, NS, {"status": {"conditions": [cond]}})
                return
            time.sleep(0.1)  # kmock's cost per request grows with what it recorded: poll gently

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_run_job_is_one_mlflow_run_with_the_functions_outputs_and_the_pod_logs(kmock_server, make_platform, tmp_path):
    """The platform opens the run and names it in the Job's env; the real job runner (run here as the
    container would) logs params and outputs.json into that same run; the platform attaches the pod
    logs and reads outputs.json back into the JobResult. One run per Job."""
    from mlflow.tracking import MlflowClient

    kmock_server.emulator["get", re.compile(r".*/pods/[^/]+/log$")] << "epoch 1 loss 0.42\n"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    plat = make_platform(tracking_uri=uri, job_grace_s=120)
    job = Job(name="train", entrypoint="k8s_jobfns:train", params={"epochs": 3})
    helper = _complete_job_when_created(plat, succeed=True, run=True)
    result = plat.run_job(job, {"api_token": "s3cret", "lr": 0.01})
    helper.join(5)
    assert result.succeeded and result.run_id, result.message
    assert result.outputs == {"accuracy": pytest.approx(0.8), "epochs": 3}  # read back from the run
    create = next(r for r in kmock_server.requests() if r.method.value == "POST"
                  and r.url.path == "/apis/batch/v1/namespaces/scanflow/jobs")
    spec = create.data["spec"]
    assert spec["backoffLimit"] == 1 and spec["ttlSecondsAfterFinished"] == 3600
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_RUN_ID"] == result.run_id and env["MLFLOW_TRACKING_URI"] == uri
    assert "s3cret" not in create.text
    client = MlflowClient(uri)
    run = client.get_run(result.run_id)
    assert run.data.params == {"epochs": "3", "lr": "0.01"} and run.info.status == "FINISHED"
    assert "job_duration_s" in run.data.metrics  # the same bookkeeping as a local job (scanflow.platform.jobruns)
    assert len(client.search_runs([run.info.experiment_id])) == 1  # one run per Job
    # the experiment the local platform uses too when the Executor runs it (jobruns.jobs_experiment)
    assert client.get_experiment(run.info.experiment_id).name == jobs_experiment(plat.workflow or plat.namespace)
    assert env["MLFLOW_EXPERIMENT_NAME"] == jobs_experiment(plat.workflow or plat.namespace)
    local = client.download_artifacts(result.run_id, f"logs/{result.name}.log", str(tmp_path))
    assert "epoch 1 loss 0.42" in Path(local).read_text()


def test_run_job_failure_and_timeout(kmock_server, make_platform):
    plat = make_platform()
    helper = _complete_job_when_created(plat, succeed=False)
    failed = plat.run_job(Job(name="train", entrypoint=["python", "-c", "raise SystemExit(1)"]))
    helper.join(5)
    assert not failed.succeeded and failed.message.startswith("failed: Done")
    plat2 = make_platform(job_grace_s=0)
    timed_out = plat2.run_job(Job(name="slow", entrypoint=["sleep", "100"], timeout_s=0.05))
    assert not timed_out.succeeded and "timed out" in timed_out.message
    assert any(m == "DELETE" and p.endswith(f"/jobs/{timed_out.name}") for m, p, _ in kmock_server.calls())


def _rbac(req: Any) -> tuple[str, str]:
    """An API request -> the (resource[/subresource], RBAC verb) a real API server would check."""
    verb = {"GET": "get" if req.name else "list", "POST": "create", "PATCH": "patch", "DELETE": "delete"}[
        req.method.value]
    res = req.resource.plural + (f"/{req.subresource}" if req.subresource else "")
    return res, verb


def test_every_request_is_granted_by_the_role(kmock_server, make_platform):
    """Run every operation, then check each request against deploy/base/rbac.yaml (what a real server does)."""
    import yaml

    rbac = Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac.yaml"
    role = next(d for d in yaml.safe_load_all(rbac.read_text()) if d["kind"] == "Role")
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    plat = make_platform(minor=34)
    plat.deploy(BACKUP)
    kmock_server.mark()  # from here on: what the Executor does in a running system
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    plat.scale("digits", 3)
    plat.set_resources("digits", Resources(cpu=1, memory="512Mi"))
    plat.route("digits", to="digits-backup")
    plat.route("digits")
    plat.swap_model("digits", "models:/digits/7")
    helper = _complete_job_when_created(plat, succeed=True)
    plat.run_job(Job(name="train", entrypoint=["true"]))
    helper.join(5)
    plat.delete("digits")
    used = {_rbac(r) for r in kmock_server.requests() if r.resource is not None}
    helper_calls = {("jobs", "list"), ("pods", "create"), ("jobs/status", "patch")}  # the fake controller
    assert used - helper_calls <= grants, sorted(used - helper_calls - grants)
    assert {("pods/resize", "patch"), ("deployments/scale", "patch"), ("jobs", "create")} <= used


def test_no_reconcile_while_a_resize_of_the_service_is_in_flight(kmock_server, make_platform):
    """The size annotation is written only once the pods took the new size: a reconcile in between
    would ask them back to the old one, so it waits its turn (the next tick)."""
    plat = make_platform(minor=34)
    plat.deploy(PRIMARY)
    add_pod(plat, "digits-a", "digits")
    plat._patch_deployment("digits", {"metadata": {"annotations": {
        "scanflow.io/resized": '{"resources": {"limits": {"cpu": "1", "memory": "512Mi"}, '
                               '"requests": {"cpu": "1", "memory": "512Mi"}}, "threads": 1}'}}})
    with plat.resizing.of("digits"):
        assert plat.reconcile_resized("digits") == []
    assert plat.reconcile_resized("digits") == ["digits-a"]  # differs from the annotation: asked
