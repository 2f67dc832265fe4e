"""Ownership, adoption and truthful readiness of what the Executor runs on Kubernetes (issue 14).

Against kmock with the official client: a restarted Executor reads back what runs (replicas, image,
resources) and its start-up apply keeps them; what it creates carries its label and field manager.
Pure decisions (rollout completion, the HPA rule, version-aware resize) are tested directly.
"""

from __future__ import annotations

import pytest

from scanflow.platform import k8s_resources as kr
from scanflow.platform import manifests as mf
from scanflow.platform.adoption import adopt_running
from scanflow.platform.base import PlatformError
from scanflow.spec import Affinity, Job, Resources, Service

NS = "scanflow"
PRIMARY = Service(name="digits", model_uri="models:/digits@champion", replicas=2,
                  resources=Resources(cpu=1.5, memory="512Mi"), backup="digits-backup")


def stored(km, group_version_plural: str, name: str) -> dict:
    """The object kmock holds (what a GET would answer)."""
    for (resource, ns, obj_name), obj in km.emulator.objects.items():
        if f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/") == group_version_plural \
                and ns == NS and obj_name == name and not obj.deleted:
            return dict(obj.raw)
    raise KeyError(name)


def test_restarted_executor_adopts_replicas_image_and_resources(kmock_server, make_platform):
    first = make_platform(workflow="digits", image="registry.example.com/scanflow:1.0")
    first.deploy(PRIMARY)
    first.scale("digits", 4)  # the Planner scaled out
    # ... resized to 2 CPUs / 1Gi, and an operator rolled a new image by hand: the container a real
    # server ends up with (kmock merges strategic patches as plain JSON, replacing the container list)
    resized = mf.replica_container(PRIMARY, image="registry.example.com/scanflow:1.1",
                                   resources=Resources(cpu=2, memory="1Gi"))
    first.apps.patch_namespaced_deployment("digits", NS, {"spec": {"template": {"spec": {"containers": [resized]}}}},
                                           _content_type="application/merge-patch+json")

    # the Executor restarts with a different default image and the workflow's declaration (2 replicas, 1.5 CPU)
    again = make_platform(workflow="digits", image="scanflow:0.1.0")
    running = again.services()
    assert set(running) == {"digits"}
    assert running["digits"].replicas == 4 and running["digits"].image == "registry.example.com/scanflow:1.1"
    assert running["digits"].resources == Resources(cpu=2, memory="1Gi")
    spec = adopt_running(PRIMARY, running["digits"])
    assert spec.backup == "digits-backup"  # the declaration keeps what actuations never change
    again.deploy(spec)
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 4
    assert container["image"] == "registry.example.com/scanflow:1.1"
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}


def test_an_image_that_is_not_the_configured_one_is_an_upgrade_and_set_image_rolls_it(kmock_server, make_platform):
    from scanflow.platform.adoption import ImageUpgrade, image_upgrades

    old, new = "registry.example.com/scanflow:1.0", "registry.example.com/scanflow:1.1"
    first = make_platform(workflow="digits", image=old)
    first.deploy(PRIMARY)
    first.scale("digits", 3)
    # the Executor restarts after kustomize's `images:` moved to 1.1: adoption deploys what runs (1.0,
    # 3 replicas), and the difference is an upgrade of its own
    again = make_platform(workflow="digits", image=new)
    running = again.services()
    again.deploy(adopt_running(PRIMARY, running["digits"]))
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == old  # the restart changed nothing
    assert image_upgrades([PRIMARY], running, again.image) == [ImageUpgrade("digits", old, new)]
    # the declared image wins over the platform's; nothing running, or the same image, is no upgrade
    pinned = PRIMARY.model_copy(update={"image": old})
    assert image_upgrades([pinned], running, new) == []
    assert image_upgrades([PRIMARY], {}, new) == []
    assert image_upgrades([PRIMARY], running, None) == []

    before = dep["spec"]["template"]["spec"]["containers"][0]
    again.set_image("digits", new)
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    after = dep["spec"]["template"]["spec"]["containers"][0]
    assert after["image"] == new
    assert {k: v for k, v in after.items() if k != "image"} == {k: v for k, v in before.items() if k != "image"}
    assert dep["spec"]["replicas"] == 3  # an upgrade keeps what the loop decided
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert again.services()["digits"].image == new
    with pytest.raises(PlatformError, match="not an image reference"):
        again.set_image("digits", "bad image")


def test_deploy_without_a_running_deployment_uses_the_configured_image(kmock_server, make_platform):
    plat = make_platform(workflow="digits", image="registry.example.com/scanflow@sha256:" + "a" * 64)
    plat.deploy(PRIMARY)
    dep = stored(kmock_server, "apps/v1/deployments", "digits")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith("a" * 64)


def test_adoption_ignores_what_the_executor_does_not_own(kmock_server, make_platform):
    plat = make_platform(workflow="digits")
    foreign = mf.deployment(Service(name="other", model_uri="models:/x@champion"), workflow="digits")
    foreign["metadata"]["labels"][mf.OWNER_LABEL] = "kustomize"
    plat.apps.create_namespaced_deployment(NS, foreign)
    other_wf = mf.deployment(Service(name="elsewhere", model_uri="models:/x@champion"), workflow="sensors")
    plat.apps.create_namespaced_deployment(NS, other_wf)
    plat.deploy(PRIMARY)
    assert set(plat.services()) == {"digits"}
    # what deploy/base used to declare (managed-by: scanflow) is adopted on upgrade, not reset
    legacy = mf.deployment(Service(name="digits-backup", model_uri="models:/digits@champion", replicas=3),
                           workflow="digits")
    legacy["metadata"]["labels"][mf.OWNER_LABEL] = "scanflow"
    plat.apps.create_namespaced_deployment(NS, legacy)
    assert plat.services()["digits-backup"].replicas == 3


def test_everything_the_executor_creates_is_labelled_as_its_own(kmock_server, make_platform):
    plat = make_platform(workflow="digits")
    plat.deploy(PRIMARY)
    for kind in ("apps/v1/deployments", "v1/services"):
        obj = stored(kmock_server, kind, "digits")
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scanflow-executor", kind
        assert obj["metadata"]["namespace"] == NS
    job = mf.batch_job(Job(name="train", entrypoint="m:f"), "train-1")
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scanflow-executor"


def test_replicas_get_the_tracker_url_and_a_spool_when_configured(kmock_server, make_platform):
    plat = make_platform(workflow="digits", tracker_url="http://tracker:8080")
    plat.deploy(PRIMARY)
    env = {e["name"]: e.get("value") for e in
           stored(kmock_server, "apps/v1/deployments", "digits")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCANFLOW_TRACKER_URL"] == "http://tracker:8080"
    assert env["SCANFLOW_SPOOL_DIR"].startswith("/tmp/")  # the only writable path (read-only root)


def test_own_image_is_read_from_the_executors_pod(kmock_server, make_platform):
    plat = make_platform()
    plat.core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod",
                                         "metadata": {"name": "executor-abc", "namespace": NS},
                                         "spec": {"containers": [{"name": "executor", "image": "reg/scanflow:9"}]}})
    assert plat.own_image("executor-abc") == "reg/scanflow:9"
    with pytest.raises(Exception, match="SCANFLOW_POD_NAME"):
        plat.own_image(None)


def test_adopt_running_keeps_declared_placement_and_widens_bounds() -> None:
    declared = Service(name="s", model_uri="models:/m@champion", replicas=1, max_replicas=4,
                       affinity=Affinity(node_selector={"pool": "inference"}))
    running = Service(name="s", model_uri="models:/m/7", replicas=6, max_replicas=256, min_replicas=0,
                      affinity=Affinity(policy="pinned"), resources=Resources(cpu=3, memory="2Gi"))
    out = adopt_running(declared, running)
    assert (out.replicas, out.max_replicas, out.model_uri) == (6, 6, "models:/m/7")
    assert out.affinity.policy == "pinned" and out.affinity.node_selector == {"pool": "inference"}
    assert adopt_running(declared, None) is declared


# -- pure decisions ------------------------------------------------------------------------------------


def dep(generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2, total: int = 2,
        available: int = 2) -> dict:
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated, "replicas": total,
                       "availableReplicas": available, "readyReplicas": available}}


@pytest.mark.parametrize(("state", "done"), [
    (dep(), True),
    (dep(observed=1), False),  # the controller has not seen the new spec yet
    (dep(updated=1, total=3, available=3), False),  # old pods still serve: readyReplicas alone said "done"
    (dep(updated=2, total=3, available=2), False),  # the last old pod is still terminating
    (dep(updated=2, total=2, available=1), False),  # a new pod is not ready yet
])
def test_rollout_complete_waits_for_the_whole_rollout(state, done) -> None:
    assert mf.rollout_complete(state) is done


@pytest.mark.parametrize(("cur_min", "cur_max", "wanted", "bounds"), [
    (1, 10, 4, (4, 10)),  # scale out: the floor rises, the HPA may go higher
    (4, 10, 2, (2, 10)),  # scale in: the floor drops, the HPA shrinks when its metric agrees
    (1, 3, 5, (2, 3)),  # beyond the ceiling: the ceiling stays, the HPA decides the last replica
    (1, 3, 3, (2, 3)),  # at the ceiling: the same
    (None, 6, 1, (1, 6)),
    (1, 1, 4, (1, 1)),  # its owner pinned it at 1: nothing to leave to the HPA
])
def test_hpa_rule_sets_the_floor_and_never_pins(cur_min, cur_max, wanted, bounds) -> None:
    lo, hi = mf.hpa_bounds(cur_min, cur_max, wanted)
    assert (lo, hi) == bounds and lo <= hi and hi == cur_max  # the owner's ceiling is never moved
    if cur_max > 1:
        assert lo < hi  # min == max would disable the HPA


def test_hpa_rule_refuses_zero() -> None:
    with pytest.raises(ValueError):
        mf.hpa_bounds(1, 5, 0)


@pytest.mark.parametrize(("minor", "new_memory", "method", "why"), [
    (33, "256Mi", "rolling-update", "memory-limit decrease"),
    (34, "256Mi", "rolling-update", "< 1.35"),
    (35, "256Mi", "in-place", "supports"),
    (34, "1Gi", "in-place", "supports"),  # an increase is fine from 1.33
])
def test_resize_choice_knows_the_memory_decrease_rule(minor, new_memory, method, why) -> None:
    cur = kr.resources_block(Resources(cpu=1, memory="512Mi"))
    new = kr.resources_block(Resources(cpu=1, memory=new_memory))
    plan = kr.choose_resize_method((1, minor), cur, new, "none", "none")
    assert plan.method == method and why in plan.reason


def test_platform_predicts_the_memory_fallback_on_1_34(kmock_server, make_platform):
    plat = make_platform(minor=34)
    plat.deploy(PRIMARY)
    kmock_server.mark()
    change = plat.set_resources("digits", Resources(cpu=1.5, memory="256Mi"))
    assert change.method == "rolling-update" and "1.35" in change.notes[0]
    assert not [r for r in kmock_server.requests() if r.url.path.endswith("/resize")]  # never tried in place


def test_replica_probes_are_truthful() -> None:
    container = mf.replica_container(PRIMARY, image="x")
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"  # model load before liveness counts
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 300
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_from_settings_needs_a_namespace_and_never_guesses_an_image() -> None:
    from scanflow.platform.base import PlatformError
    from scanflow.platform.kubernetes import KubernetesPlatform
    from scanflow.settings import Settings

    with pytest.raises(PlatformError, match="SCANFLOW_NAMESPACE"):
        KubernetesPlatform.from_settings(Settings(namespace=None), workflow="digits", tracking_uri=None)


def test_the_own_service_keeps_selecting_the_primary_through_a_failover(kmock_server, make_platform):
    plat = make_platform(workflow="digits")
    plat.deploy(PRIMARY)
    plat.deploy(Service(name="digits-backup", model_uri="models:/digits@champion"))
    plat.route("digits", to="digits-backup")
    assert stored(kmock_server, "v1/services", "digits")["spec"]["selector"] == {"scanflow.io/service": "digits-backup"}
    own = stored(kmock_server, "v1/services", "digits-own")
    assert own["spec"]["selector"] == {"scanflow.io/service": "digits"}  # what the gateway (and Checker) see
    assert own["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scanflow-executor"
    plat.delete("digits")
    with pytest.raises(KeyError):
        stored(kmock_server, "v1/services", "digits-own")


def test_an_own_service_with_a_cluster_ip_is_recreated_headless(kmock_server, make_platform):
    # made by an earlier version: a ClusterIP Service (clusterIP is immutable: an apply cannot change it)
    plat = make_platform(workflow="digits")
    old = mf.own_service(PRIMARY, namespace=plat.namespace, workflow="digits")
    old["spec"]["clusterIP"] = "10.96.0.50"
    old["metadata"]["labels"]["made-by"] = "an-earlier-version"  # an apply would keep it, a re-create drops it
    plat.core.create_namespaced_service(plat.namespace, old)
    status = plat.deploy(PRIMARY)
    own = stored(kmock_server, "v1/services", "digits-own")
    assert own["spec"]["clusterIP"] == "None"  # headless: its DNS name answers with each ready pod
    assert "made-by" not in own["metadata"]["labels"]
    assert any("re-created headless" in n for n in status.notes)
    plat.deploy(PRIMARY)  # already headless: left as it is
    assert stored(kmock_server, "v1/services", "digits-own")["spec"]["clusterIP"] == "None"


def test_the_resized_annotation_is_what_runs_unless_it_cannot_be_read() -> None:
    import json

    dep = mf.deployment(PRIMARY, workflow="digits")
    assert mf.resized_to(dep) is None and mf.running_service(dep)["resources"] == {"cpu": 1.5, "memory": "512Mi"}
    block = {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
    dep["metadata"].setdefault("annotations", {})[mf.RESIZED_ANNOTATION] = json.dumps({"resources": block, "threads": 1})
    assert mf.resized_to(dep) == (block, 1)
    found = mf.running_service(dep)
    assert found["resources"] == {"cpu": 0.5, "memory": "256Mi"} and found["threads"] == 1
    for garbage in ("not json", "[]", '{"threads": 2}'):  # edited by hand: the template stands
        dep["metadata"]["annotations"][mf.RESIZED_ANNOTATION] = garbage
        assert mf.resized_to(dep) is None
        assert mf.running_service(dep)["resources"] == {"cpu": 1.5, "memory": "512Mi"}
