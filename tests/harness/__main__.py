"""Run a scenario on the emulated cluster: `unshare -m -n python -m tests.harness --overlay dev --out R.json`.

Must run in a private mount + network namespace (the e2e test starts it so): the cluster's bridge, pod
namespaces, Service addresses and /etc/hosts live and die there. Writes a JSON result (the figures the
test asserts on) and the pods' logs under --workdir.

Scenarios, in order, on one install: `wired` (MLflow, PostgreSQL, the bootstrap Job, the four agents and
the gateway come up from the rendered manifests; the Executor creates `digits` and `digits-backup`
through the API; a prediction through the gateway's Service reaches the Tracker), then `s4` (the
primary's containers crash -> the Checker sees it -> the Planner routes -> the Executor patches the
`digits` Service's selector; failed requests through the gateway's Service counted), `s1` (drift ->
retrain Job -> promotion -> the replicas roll), `s2` and `s3` (the demo's autoscale and tune scenarios
through the agents, on the replicas' container CPU limits; tests/harness/tuning_scenarios.py), `resize`
(in place, a scale-up after it, then one beyond the node) and `upgrade` (an image bump rolls every
replica, under load; tests/harness/upgrade.py); `delivery`: S1 delivers progressively (delivery_scenario.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from scanflow.deploy_secrets import env_name, generate, mlflow_password_key, token_key

from .cluster import ROOT, Cluster
from .delivery_scenario import s1_with_delivery, with_delivery
from .policy_scenario import run_netpol
from .tuning_scenarios import run_tuning
from .upgrade import run_upgrade
from .waiting import deployment_ready, svc, wait_for

NS = "scanflow"


def render(overlay: str, workdir: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` of an overlay; the dev overlay's secrets.env generated as `make dev-secrets` does."""
    import shutil

    root = workdir / "deploy"
    shutil.copytree(ROOT / "deploy", root, ignore=shutil.ignore_patterns("secrets.env"))
    if overlay == "dev":
        # the copy has no scanflow package or .venv of its own: this interpreter and the checkout's code
        env = {**os.environ, "PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run(["sh", str(root / "overlays/dev/gen-secrets.sh")], check=True, capture_output=True, env=env)
    out = subprocess.run(["kubectl", "kustomize", str(root / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    if not any(d["kind"] == "Secret" and d["metadata"]["name"] == "scanflow-secrets" for d in docs):
        docs.insert(0, out_of_band_secret())  # prod: created out of band, as its kustomization says
    return docs


def out_of_band_secret() -> dict[str, Any]:
    """`kubectl create secret generic scanflow-secrets --from-env-file=...` of fresh values (the prod
    overlay's instructions: scanflow.deploy_secrets)."""
    import base64

    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "scanflow-secrets", "namespace": NS},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in generate().items()}}


def operator_of(docs: list[dict[str, Any]]) -> tuple[str, str]:
    """The operator's credentials in the rendered Secret: (Scanflow token, MLflow password)."""
    import base64

    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"] == "scanflow-secrets":
            data = d["data"]
            return (base64.b64decode(data[token_key("operator")]).decode(),
                    base64.b64decode(data[mlflow_password_key("operator")]).decode())
    raise KeyError("scanflow-secrets")


def login_as_operator(password: str) -> None:
    """The test's own MLflow calls (S1 reads the champion) go through MLflow's auth proxy as the operator."""
    os.environ["MLFLOW_TRACKING_USERNAME"] = "operator"
    os.environ["MLFLOW_TRACKING_PASSWORD"] = password


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overlay", default="dev", help="a deploy/overlays name, or `compose` for docker-compose.yml")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scenarios", default="wired,s4")
    ap.add_argument("--up-timeout", type=float, default=600)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("aiohttp.access", "httpx", "kmock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally`: stop every pod
    result: dict[str, Any] = {"ok": False, "phases": {}}
    t0 = time.monotonic()
    cluster = Cluster(args.workdir)
    try:
        if args.overlay == "compose":
            config, token, password = render_compose()
            cluster.start()
            result["applied"] = up_compose(cluster, config, args.up_timeout)
            run_wired_compose(cluster, token, result, args.up_timeout)
            gateway = "http://executor:8090"  # SCANFLOW_SERVICE_URLS: the Executor's local platform
            kill, routed = kill_compose_primary, compose_routed_to_backup
        else:
            docs = render(args.overlay, args.workdir)
            docs = with_delivery(docs, NS) if "delivery" in args.scenarios else docs
            token, password = operator_of(docs)
            cluster.start()
            cluster.apply(docs)
            result["applied"] = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
            run_wired(cluster, token, result, args.up_timeout)
            gateway = "http://digits-gateway:8080"
            kill = lambda c: c.crash(("Deployment", "digits"))
            routed = selector_on_backup
        login_as_operator(password)
        result["phases"]["wired"] = round(time.monotonic() - t0, 1)
        if "s4" in args.scenarios:
            run_s4(cluster, gateway, kill, routed, result)
            result["phases"]["s4"] = round(time.monotonic() - t0, 1)
        if "s1" in args.scenarios:
            if "delivery" in args.scenarios:
                s1_with_delivery(run_s1, gateway, token, cluster, result)
            else:
                run_s1(gateway, token, result)
            if args.overlay != "compose":
                s1_on_kubernetes(cluster, result)
            result["phases"]["s1"] = round(time.monotonic() - t0, 1)
        tuning = [n for n in ("s2", "s3") if n in args.scenarios.split(",")]
        if tuning and args.overlay != "compose":
            run_tuning(cluster, token, tuning, "s1" in args.scenarios.split(","), result)
            result["phases"]["tuning"] = round(time.monotonic() - t0, 1)
        if "resize" in args.scenarios and args.overlay != "compose":
            run_resize(cluster, token, result)
            result["phases"]["resize"] = round(time.monotonic() - t0, 1)
        if "netpol" in args.scenarios:
            run_netpol(cluster, result)
        if "upgrade" in args.scenarios and args.overlay != "compose":
            run_upgrade(cluster, gateway, token, result)
            result["phases"]["upgrade"] = round(time.monotonic() - t0, 1)
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001  # the result says what failed; the logs say why
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        result["events"] = cluster.events[-200:]
        result["seconds"] = round(time.monotonic() - t0, 1)
        if not result["ok"]:
            result["logs"] = cluster.pod_logs(tail=2500) if cluster.workdir.exists() else ""
        args.out.write_text(json.dumps(result, indent=1, default=str))
        cluster.close()
    return 0 if result["ok"] else 1




def run_wired(cluster: Cluster, token: str, result: dict[str, Any], timeout_s: float) -> None:
    """The install comes up from the manifests alone and is wired: Tracker <- replicas, agents <- peers."""
    t0 = time.monotonic()

    def bootstrap_done() -> bool:
        job = cluster.get("batch/v1", "Job", "scanflow-bootstrap") or {}
        conds = {c["type"]: c["status"] for c in (job.get("status") or {}).get("conditions") or []}
        if conds.get("Failed") == "True":
            raise RuntimeError("bootstrap Job failed")
        return conds.get("Complete") == "True"

    wait_for(bootstrap_done, timeout_s, "the bootstrap Job completes", interval_s=1)
    result["bootstrap_s"] = round(time.monotonic() - t0, 1)
    for name in ("mlflow", "tracker", "checker", "planner", "executor", "digits", "digits-backup", "digits-gateway"):
        wait_for(lambda n=name: deployment_ready(cluster, n), timeout_s - (time.monotonic() - t0),
                 f"deployment {name} ready", interval_s=1)
    result["up_s"] = round(time.monotonic() - t0, 1)
    dep = cluster.get("apps/v1", "Deployment", "digits") or {}
    result["digits_managed_by"] = dep["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by")
    result["digits_image"] = dep["spec"]["template"]["spec"]["containers"][0]["image"]
    # agents know their peers (SCANFLOW_PEERS) and answer through their Services
    hdr = {"Authorization": f"Bearer {token}"}
    result["peers"] = {a: httpx.get(f"{svc(cluster, a)}/status", headers=hdr, timeout=10).json()["peers"]
                       for a in ("tracker", "checker", "planner", "executor")}
    # a prediction through the gateway's Service reaches the Tracker (SCANFLOW_TRACKER_URL of the replicas)
    from scanflow.examples.digits.s1 import traffic_pools

    pools = traffic_pools()
    x = pools["clean"][0][:20].tolist()
    for row in x:
        r = httpx.post(f"{svc(cluster, 'digits-gateway')}/predict", json={"inputs": [row]}, timeout=30)
        r.raise_for_status()

    def tracker_logged() -> bool:
        events = httpx.get(f"{svc(cluster, 'tracker')}/events", headers=hdr, timeout=10).json()
        return any(e.get("name") == "predictions.logged" for e in events)

    wait_for(tracker_logged, 60, "the Tracker logs the gateway's predictions", interval_s=1)
    result["tracker_received"] = True
    if cluster.get("apps/v1", "Deployment", "digits-gateway"):
        # Kubernetes: the gateway balances over the pods themselves (digits-own is headless), not over
        # one ClusterIP: its replicas are the ready digits pods' addresses
        pods = [p for p in cluster.list("v1", "Pod")
                if (p["metadata"].get("labels") or {}).get("scanflow.io/service") == "digits"]
        result["digits_pod_ips"] = sorted((p.get("status") or {}).get("podIP") or "" for p in pods)
        state = httpx.get(f"{svc(cluster, 'digits-gateway')}/admin/state", headers=hdr, timeout=10)
        result["gateway_state_status"] = state.status_code
        if state.status_code == 200:
            result["gateway_replicas"] = sorted(r["url"] for r in state.json()["replicas"])
            result["gateway_discovery"] = state.json().get("discovery")


def selector_on_backup(cluster: Cluster) -> bool:
    """Kubernetes: the Planner's route is the Executor's patch of the `digits` Service's selector."""
    svc_ = cluster.get("v1", "Service", "digits") or {}
    return ((svc_.get("spec") or {}).get("selector") or {}).get("scanflow.io/service") == "digits-backup"


def run_s4(cluster: Cluster, gateway: str, kill: Callable[[Cluster], int], routed: Callable[[Cluster], bool],
           result: dict[str, Any]) -> None:
    """S4: the primary's replicas keep crashing until the Planner's route is in force; the requests
    through the gateway are counted (the gateway moves to the backup at once, by its own checks)."""
    from scanflow.examples.digits.s1 import traffic_pools

    from scanflow.embedded.traffic import Traffic

    pools = traffic_pools()
    result["s4_routed_before"] = routed(cluster)
    with Traffic(gateway, pools["clean"], pools["clean"], rate=20, clients=2) as traffic:
        wait_for(lambda: traffic.count() > 20, 60, "traffic answered before the crash")
        killed_at = time.time()

        def routed_to_backup() -> bool:
            kill(cluster)  # keep the primary down until the Planner has decided
            return routed(cluster)

        # measured: 5 s on the dev overlay; 122 s on compose at load ~12, where the route plan waited
        # behind a scale plan (the Executor runs one plan at a time; a scale waits up to 120 s for
        # replicas that this loop keeps killing)
        wait_for(routed_to_backup, 300, "the Planner's route to the backup", interval_s=0.3)
        result["s4_failover_s"] = round(time.time() - killed_at, 1)
        if routed is selector_on_backup:  # the `digits` Service's own address now reaches the backup's pods
            one = {"inputs": [pools["clean"][0][0].tolist()]}
            wait_for(lambda: httpx.post(f"{svc(cluster, 'digits')}/predict", json=one, timeout=10).status_code == 200,
                     10, "kube-proxy follows the new selector", interval_s=0.2)
            result["s4_direct_after_route"] = [
                httpx.post(f"{svc(cluster, 'digits')}/predict", json=one, timeout=10).status_code for _ in range(10)]
        on_backup = traffic.count()
        wait_for(lambda: traffic.count() > on_backup + 20, 60, "traffic served after the failover")
    result["s4_requests"] = traffic.count()
    result["s4_failed"] = len(traffic.failed())
    result["s4_failed_samples"] = [str(a) for a in traffic.failed()[:5]]


def run_s1(gateway: str, token: str, result: dict[str, Any], during: Callable[[], None] | None = None) -> None:
    """S1: drifted traffic -> the Checker -> the Planner's retrain -> the Executor's training Job (run
    by the emulated kubelet) -> promotion -> the replicas roll onto the new version; 0 failed requests."""
    import mlflow
    from scanflow.examples.digits.s1 import traffic_pools

    from scanflow.embedded.traffic import Traffic
    from scanflow.tracking.registry import CHAMPION, get_alias_version

    mlflow.set_tracking_uri("http://mlflow:5000")  # the Service name, through the private /etc/hosts
    pools = traffic_pools()
    old = get_alias_version("digits", CHAMPION)
    result["s1_old_version"] = old
    with Traffic(gateway, pools["clean"], pools["drifted"], rate=30, clients=2,
                 tracker_url="http://tracker:8080", token=token) as traffic:
        wait_for(lambda: traffic.count() > 50, 60, "clean traffic answered")
        onset = time.time()
        traffic.drifted = True

        def new_version_serves() -> str | None:
            if during is not None:  # the delivery scenario's reads of the gateways
                during()
            cur = get_alias_version("digits", CHAMPION)
            if cur is None or cur == old:
                return None
            recent = [a for a in traffic.snapshot()[-20:] if a.status == 200]
            return cur if recent and all(a.version == cur for a in recent) else None

        new = wait_for(new_version_serves, 420, "a new champion serving after the drift onset", interval_s=1)
        result["s1_new_version"] = new
        result["s1_onset_to_served_s"] = round(min(a.t for a in traffic.snapshot() if a.version == new) - onset, 1)
    result["s1_requests"] = traffic.count()
    result["s1_failed"] = len(traffic.failed())
    result["s1_failed_samples"] = [str(a) for a in traffic.failed()[:5]]


def s1_on_kubernetes(cluster: Cluster, result: dict[str, Any]) -> None:
    """What S1 left in the API: the training Job the Executor created, the replicas' new command."""
    result["s1_jobs"] = [j["metadata"]["name"] for j in cluster.list("batch/v1", "Job")
                         if j["metadata"]["name"] != "scanflow-bootstrap"]
    dep = cluster.get("apps/v1", "Deployment", "digits") or {}
    result["s1_digits_command"] = dep["spec"]["template"]["spec"]["containers"][0]["command"]


def run_resize(cluster: Cluster, token: str, result: dict[str, Any]) -> None:
    """An in-place resize through the Executor's REST API (the operator's token), on the emulated
    kubelet: the Planner is scaled to 0 first, as an operator would for maintenance (its autoscale,
    declared in the workflow's code, cannot be removed over REST and would move the replica count
    meanwhile: it scaled the added pod away in two runs), `digits` is resized, then scaled up by one. Records whether the pods and the pod template stayed
    the same, and whether the added pod, started from the template at the old size, came to the new
    size (the Executor's reconcile sensor, every 10 s)."""
    from scanflow.platform.k8s_resources import normalise

    from . import model

    auth = {"Authorization": f"Bearer {token}"}
    executor = svc(cluster, "executor")
    cluster._merge("apps/v1", "Deployment", "planner", {"spec": {"replicas": 0}})
    wait_for(lambda: not cluster._owned("Deployment", "planner"), 60, "the Planner scaled to 0")

    def pods() -> list[str]:
        return sorted(p.name for p in cluster._owned("Deployment", "digits"))

    def settled() -> bool:
        """No plan left in the Executor's inbox, and the last rollout (S1's swap) complete."""
        pending = httpx.get(f"{executor}/events", params={"status": "pending"}, headers=auth, timeout=10).json()
        dep = cluster.get("apps/v1", "Deployment", "digits") or {}
        current = model.template_hash(dep["spec"]["template"])
        owned = cluster._owned("Deployment", "digits")
        return (not pending and len(owned) == int(dep["spec"].get("replicas", 1))
                and all(p.ready and p.hash == current for p in owned))

    wait_for(settled, 180, "digits settled before the resize")

    def limits(name: str) -> dict[str, Any]:
        pod = cluster.get("v1", "Pod", name) or {}
        status = next((c for c in (pod.get("status") or {}).get("containerStatuses") or []
                       if c.get("name") == "replica"), {})
        return (status.get("resources") or {}).get("limits") or {}

    def template() -> str:
        return model.template_hash((cluster.get("apps/v1", "Deployment", "digits") or {})["spec"]["template"])

    before, hash_before = pods(), template()
    now = {normalise("cpu", limits(n).get("cpu", "0")) for n in before}
    cpu = 0.5 if 0.75 in now else 0.75
    memory = limits(before[0]).get("memory", "512Mi")
    r = httpx.post(f"{executor}/actuators/set_resources", headers=auth, timeout=180,
                   json={"args": {"service": "digits", "resources": {"cpu": cpu, "memory": memory}}})
    body = r.json()
    result.update({"resize_cpu": cpu, "resize_status": body.get("status"), "resize_detail": body.get("detail"),
                   "resize_method": (body.get("result") or {}).get("method"),
                   "resize_same_pods": pods() == before, "resize_same_template": template() == hash_before,
                   "resize_pod_cpus": sorted(normalise("cpu", limits(n).get("cpu", "0")) for n in pods()),
                   # the kubelet reported each pod PodResizeInProgress before actuating: the Executor waited it out
                   "resize_in_progress_pods": sorted({e.split()[1] for e in cluster.events
                                                      if e.endswith("resize in progress")} & set(before))})
    r = httpx.post(f"{executor}/actuators/scale", headers=auth, timeout=180,
                   json={"args": {"service": "digits", "replicas": len(before) + 1}})
    result["resize_scale_status"] = r.json().get("status")

    def added_at_the_new_size() -> str | None:
        added = [n for n in pods() if n not in before]
        return next((n for n in added if normalise("cpu", limits(n).get("cpu", "0")) == cpu), None)

    result["resize_added_pod"] = wait_for(added_at_the_new_size, 120, "the added pod at the resized size")
    result["resize_template_after_scale"] = template() == hash_before
    run_infeasible_resize(cluster, executor, auth, pods, template, limits, memory, result)


def run_infeasible_resize(cluster: Cluster, executor: str, auth: dict[str, str], pods: Callable[[], list[str]],
                          template: Callable[[], str], limits: Callable[[str], dict[str, Any]], memory: str,
                          result: dict[str, Any]) -> None:
    """A resize beyond the emulated node (model.NODE_ALLOCATABLE): the kubelet reports it Infeasible, the
    Executor falls back to a rolling update whose new pod the scheduler cannot place, and after its
    rollout wait it puts the template back and fails the step, saying both. Records what the Executor
    answered and whether the pods, their size and the template are as they were."""
    from scanflow.platform.k8s_resources import normalise

    from . import model

    def settled_on(names: list[str], hash_: str) -> bool:
        return pods() == names and template() == hash_ and all(
            p.ready and p.hash == hash_ for p in cluster._owned("Deployment", "digits"))

    # every pod ready first: a rolling update scales down an old pod that is not ready yet (as the
    # Deployment controller does), and the step would then end on other pods than it began with
    wait_for(lambda: settled_on(pods(), template()), 180, "digits ready before the infeasible resize")
    before, hash_before = pods(), template()
    cpus_before = sorted(normalise("cpu", limits(n).get("cpu", "0")) for n in before)
    too_big = normalise("cpu", model.NODE_ALLOCATABLE["cpu"]) + 2
    r = httpx.post(f"{executor}/actuators/set_resources", headers=auth, timeout=600,
                   json={"args": {"service": "digits", "resources": {"cpu": too_big, "memory": memory}}})
    result.update({"infeasible_http": r.status_code, "infeasible_detail": str(r.json().get("detail", r.text))[:600],
                   "infeasible_events": [e for e in cluster.events if "infeasible" in e or "unschedulable" in e][:6]})
    # the template put back makes the old pods current again; the unplaceable ones go (what is left
    # when it does not is recorded for the failure message)
    try:
        wait_for(lambda: settled_on(before, hash_before), 120, "digits back as it was after the infeasible resize")
        result["infeasible_settled"] = True
    except TimeoutError:
        dep = cluster.get("apps/v1", "Deployment", "digits") or {}
        result["infeasible_settled"] = False
        result["infeasible_unsettled"] = {
            "pods_before": before, "pods_now": pods(), "same_template": template() == hash_before,
            "template_now": dep.get("spec", {}).get("template")}
    result["infeasible_pod_cpus_kept"] = sorted(
        normalise("cpu", limits(n).get("cpu", "0")) for n in pods()) == cpus_before


# -- docker-compose.yml ------------------------------------------------------------------------------
def render_compose() -> tuple[dict[str, Any], str, str]:
    """`docker-compose config` with fresh secrets (compose refuses to start without them), as the .env
    `python -m scanflow.deploy_secrets --format compose` writes; the operator's token for the test's calls."""
    values = generate()
    env = {**os.environ, **{env_name(k): v for k, v in values.items()}}
    token, password = values[token_key("operator")], values[mlflow_password_key("operator")]
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return yaml.safe_load(out), token, password


def up_compose(cluster: Cluster, config: dict[str, Any], timeout_s: float) -> list[str]:
    """Start the services in depends_on order, honouring each condition, as `docker compose up` does."""
    from . import model

    objs = model.compose_objects(config, cluster.namespace, str(ROOT))
    order = model.compose_order(config)
    for claim in (config.get("volumes") or {}):
        (cluster.workdir / "pvc" / claim).mkdir(parents=True, exist_ok=True)
    started: list[str] = []

    def satisfied(dep: str, cond: str) -> bool:
        if dep not in started:
            return False
        if cond == "service_healthy":
            return deployment_ready(cluster, dep)
        if cond == "service_completed_successfully":
            job = cluster.get("batch/v1", "Job", dep) or {}
            return any(c["type"] == "Complete" and c["status"] == "True"
                       for c in (job.get("status") or {}).get("conditions") or [])
        return True

    deadline = time.monotonic() + timeout_s
    while len(started) < len(objs):
        for name, obj in objs.items():
            if name not in started and all(satisfied(d, c) for d, c in order[name].items()):
                cluster.apply([obj])
                started.append(name)
        if time.monotonic() > deadline:
            raise TimeoutError(f"compose: {sorted(set(objs) - set(started))} not started in {timeout_s:.0f}s")
        time.sleep(1)
    return started


def run_wired_compose(cluster: Cluster, token: str, result: dict[str, Any], timeout_s: float) -> None:
    t0 = time.monotonic()
    for name in ("tracker", "checker", "planner", "executor"):
        wait_for(lambda n=name: deployment_ready(cluster, n), timeout_s, f"compose service {name} healthy", 1)
    result["up_s"] = round(time.monotonic() - t0, 1)
    hdr = {"Authorization": f"Bearer {token}"}
    result["peers"] = {a: httpx.get(f"http://{a}:8080/status", headers=hdr, timeout=10).json()["peers"]
                       for a in ("tracker", "checker", "planner", "executor")}
    from scanflow.examples.digits.s1 import traffic_pools

    row = traffic_pools()["clean"][0][0].tolist()
    for _ in range(20):
        httpx.post("http://executor:8090/predict", json={"inputs": [row]}, timeout=30).raise_for_status()

    def tracker_logged() -> bool:
        events = httpx.get("http://tracker:8080/events", headers=hdr, timeout=10).json()
        return any(e.get("name") == "predictions.logged" for e in events)

    wait_for(tracker_logged, 60, "the Tracker logs the gateway's predictions", interval_s=1)
    result["tracker_received"] = True


def kill_compose_primary(cluster: Cluster) -> int:
    """SIGKILL the primary's replica processes, which the Executor's local platform runs in its container."""
    n = 0
    services = httpx.get("http://executor:8080/services", timeout=10).json()
    for rep in services["digits"]["replicas"]:
        if rep.get("pid"):
            try:
                os.killpg(rep["pid"], signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


def compose_routed_to_backup(cluster: Cluster) -> bool:
    """Compose: the route is the local platform's, in the gateway (`/admin/state`)."""
    return httpx.get("http://executor:8090/admin/state", timeout=5).json().get("route") == "backup"


if __name__ == "__main__":
    sys.exit(main())
