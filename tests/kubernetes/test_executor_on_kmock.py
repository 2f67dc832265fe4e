"""The Executor agent itself (a real `scanflow agent run scanflow/standard/executor.py` process) on the Kubernetes
platform, against kmock: it takes namespace, image and the Tracker from configuration, creates what it
owns, and after a SIGKILL and restart adopts what runs instead of resetting it.

kmock runs no controllers: a small loop here plays the Deployment controller's status (every wanted
replica updated and available), which is all the Executor waits on. No container runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from scanflow.platform.processes import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NS = "scanflow"
IMAGE = "registry.example.com/scanflow@sha256:" + "b" * 64
UPGRADED = "registry.example.com/scanflow@sha256:" + "c" * 64
TOKEN = "t" * 32
START_S = 120.0  # the agent imports FastAPI, SQLAlchemy, numpy and the kubernetes client on a loaded box


def status_loop(api: k8s.AppsV1Api, stop: threading.Event) -> None:
    """Play the Deployment controller: status says the rollout of the current spec is complete."""
    while not stop.is_set():
        try:
            for dep in api.list_namespaced_deployment(NS).items:
                want = dep.spec.replicas or 0
                st = dep.status
                if st is None or st.updated_replicas != want or st.available_replicas != want:
                    api.patch_namespaced_deployment(dep.metadata.name, NS, {"status": {
                        "observedGeneration": dep.metadata.generation or 0, "replicas": want,
                        "updatedReplicas": want, "readyReplicas": want, "availableReplicas": want}},
                        _content_type="application/merge-patch+json")
        except Exception:  # noqa: BLE001, S110  # the emulator is starting or stopping
            pass
        stop.wait(0.2)


def start_executor(tmp_path: Path, kubeconfig: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ,
           "SCANFLOW_PLATFORM": "kubernetes", "SCANFLOW_NAMESPACE": NS, "SCANFLOW_POD_NAME": "executor-0",
           "KUBECONFIG": str(kubeconfig), "SCANFLOW_WORKFLOW": str(ROOT / "workflows/digits/workflow.yaml"),
           "SCANFLOW_TOKEN": TOKEN, "SCANFLOW_HOME": str(tmp_path / "home"),
           "SCANFLOW_PEERS": "tracker=http://tracker:8080,planner=http://planner:8080",
           "SCANFLOW_TRACKER_URL": "http://tracker:8080",
           "MLFLOW_TRACKING_URI": "http://127.0.0.1:9",  # unreachable: monitoring gives up, the loop goes on
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for key in ("SCANFLOW_SERVICE_URLS", "SCANFLOW_CONFIG", "SCANFLOW_STORE_URL", "SCANFLOW_IMAGE"):
        env.pop(key, None)
    log = open(tmp_path / f"executor-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "scanflow.cli", "agent", "run", "scanflow/standard/executor.py",
                             "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_healthy(proc: subprocess.Popen[bytes], port: int, tmp_path: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("executor-*.log"))
            raise AssertionError(f"executor exited {proc.returncode}:\n{logs}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("executor not healthy in time")


def wait_upgrades(port: int, n: int) -> list[dict[str, Any]]:
    """The Executor's `execute-upgrade` decisions, once `n` of them have every outcome in (GET /decisions)."""
    deadline, got = time.monotonic() + START_S, []
    while time.monotonic() < deadline:
        r = httpx.get(f"http://127.0.0.1:{port}/decisions", params={"strategy": "execute-upgrade"},
                      headers={"Authorization": "Bearer " + TOKEN}, timeout=5)
        r.raise_for_status()
        got = [d for d in r.json() if d["result"] == "fired"]
        if len(got) >= n and all(d.get("outcomes") and len(d["outcomes"]) == len(d["actions"]) for d in got):
            return got
        time.sleep(0.3)
    raise AssertionError(f"no {n} finished upgrade decisions in {START_S:.0f} s: {got}")


def stored(km: Any, plural: str, name: str) -> dict[str, Any]:
    for (resource, ns, obj_name), obj in km.emulator.objects.items():
        if resource.plural == plural and ns == NS and obj_name == name and not obj.deleted:
            return dict(obj.raw)
    raise KeyError(name)


@pytest.mark.slow
def test_executor_process_creates_what_it_owns_and_adopts_it_after_a_sigkill(kmock_server, tmp_path: Path) -> None:
    kmock_server.emulator["get /version/"] << {
        "major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "0" * 40, "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": kmock_server.url}}],
        "users": [{"name": "kmock", "user": {"token": "x"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": NS}}]}))
    cfg = k8s.Configuration()
    cfg.host = kmock_server.url
    api_client = k8s.ApiClient(cfg)
    core, apps = k8s.CoreV1Api(api_client), k8s.AppsV1Api(api_client)
    core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "executor-0"},
                                    "spec": {"containers": [{"name": "executor", "image": IMAGE}]}})
    stop = threading.Event()
    controller = threading.Thread(target=status_loop, args=(apps, stop), daemon=True)
    controller.start()
    port = free_port()
    proc = start_executor(tmp_path, kubeconfig, port)
    try:
        wait_healthy(proc, port, tmp_path)
        dep = stored(kmock_server, "deployments", "digits")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert c["image"] == IMAGE  # its own pod's image, not a built-in default
        assert env["SCANFLOW_TRACKER_URL"] == "http://tracker:8080"
        assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scanflow-executor"
        for name in ("digits", "digits-own", "digits-backup", "digits-backup-own"):
            stored(kmock_server, "services", name)
        # the Planner scaled out, then the Executor dies hard
        apps.patch_namespaced_deployment_scale("digits", NS, {"spec": {"replicas": 3}},
                                               _content_type="application/merge-patch+json")
        assert stored(kmock_server, "deployments", "digits")["spec"]["replicas"] == 3  # the workflow says 1
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc = start_executor(tmp_path, kubeconfig, port)
        wait_healthy(proc, port, tmp_path)
        assert stored(kmock_server, "deployments", "digits")["spec"]["replicas"] == 3  # adopted, not reset to 1
        assert stored(kmock_server, "deployments", "digits")["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE

        # an upgrade: kustomize's `images:` moved, so the Executor's own pod comes back on the new image.
        # It adopts what runs, then rolls the replicas onto the new image as a decision of its own
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        core.delete_namespaced_pod("executor-0", NS)
        core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "executor-0"},
                                        "spec": {"containers": [{"name": "executor", "image": UPGRADED}]}})
        proc = start_executor(tmp_path, kubeconfig, port)
        wait_healthy(proc, port, tmp_path)
        upgrades = wait_upgrades(port, 2)
        assert {d["inputs"]["event"]["service"] for d in upgrades} == {"digits", "digits-backup"}, upgrades
        for d in upgrades:
            assert d["inputs"]["event"]["running"] == IMAGE and d["inputs"]["event"]["configured"] == UPGRADED
            assert [o["status"] for o in d["outcomes"].values()] == ["ok"], d
        for name in ("digits", "digits-backup"):
            dep = stored(kmock_server, "deployments", name)
            assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == UPGRADED
            assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
        assert stored(kmock_server, "deployments", "digits")["spec"]["replicas"] == 3  # still what the loop decided
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        stop.set()
        controller.join(5)
        api_client.close()
