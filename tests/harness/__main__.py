"""Run a scenario on the emulated cluster: `unshare -m -n python -m tests.harness --overlay dev --out R.json`.

Must run in a private mount + network namespace (the e2e test starts it so): the cluster's bridge, pod
namespaces, Service addresses and /etc/hosts live and die there. Writes a JSON result (the figures the
test asserts on) and the pods' logs under --workdir.

Scenarios, in order, on one install: `wired` (MLflow, PostgreSQL, the bootstrap Job, the four agents and
the gateway come up from the rendered manifests; the Executor creates `digits` and `digits-backup`
through the API; a prediction through the gateway's Service reaches the Tracker), then `s4` (the
primary's containers crash -> the Checker sees it -> the Planner routes -> the Executor patches the
`digits` Service's selector; failed requests through the gateway's Service counted).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from .cluster import ROOT, Cluster

NS = "scanflow"


def render(overlay: str, workdir: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` of an overlay; the dev overlay's secrets.env generated as `make dev-secrets` does."""
    import shutil

    root = workdir / "deploy"
    shutil.copytree(ROOT / "deploy", root, ignore=shutil.ignore_patterns("secrets.env"))
    if overlay == "dev":
        subprocess.run(["sh", str(root / "overlays/dev/gen-secrets.sh")], check=True, capture_output=True)
    out = subprocess.run(["kubectl", "kustomize", str(root / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = cond()
        except Exception:  # noqa: BLE001  # not up yet
            got = None
        if got:
            return got
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def token_of(docs: list[dict[str, Any]]) -> str:
    import base64

    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"] == "scanflow-secrets":
            return base64.b64decode(d["data"]["token"]).decode()
    raise KeyError("scanflow-secrets")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overlay", default="dev")
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
        docs = render(args.overlay, args.workdir)
        token = token_of(docs)
        cluster.start()
        cluster.apply(docs)
        result["applied"] = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
        run_wired(cluster, token, result, args.up_timeout)
        result["phases"]["wired"] = round(time.monotonic() - t0, 1)
        if "s4" in args.scenarios:
            run_s4(cluster, token, result)
            result["phases"]["s4"] = round(time.monotonic() - t0, 1)
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


def svc(cluster: Cluster, name: str, port: int = 8080) -> str:
    return f"http://{cluster.service_ip(name)}:{port}"


def deployment_ready(cluster: Cluster, name: str) -> bool:
    dep = cluster.get("apps/v1", "Deployment", name)
    return bool(dep) and int((dep.get("status") or {}).get("readyReplicas") or 0) >= int(dep["spec"].get("replicas", 1))


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
    from workflows.digits.s1 import traffic_pools

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


def run_s4(cluster: Cluster, token: str, result: dict[str, Any]) -> None:
    """S4: the primary's containers keep crashing until the `digits` Service routes to the backup."""
    from scanflow.embedded.traffic import Traffic
    from workflows.digits.s1 import traffic_pools

    pools = traffic_pools()
    url = svc(cluster, "digits-gateway")

    def selector() -> str | None:
        s = cluster.get("v1", "Service", "digits") or {}
        return ((s.get("spec") or {}).get("selector") or {}).get("scanflow.io/service")

    result["s4_selector_before"] = selector()
    with Traffic(url, pools["clean"], pools["clean"], rate=20, clients=2) as traffic:
        wait_for(lambda: traffic.count() > 20, 60, "traffic answered before the crash")
        killed_at = time.time()

        def routed_to_backup() -> bool:
            cluster.crash(("Deployment", "digits"))
            return selector() == "digits-backup"

        wait_for(routed_to_backup, 180, "the Executor routes the digits Service to the backup", interval_s=0.3)
        result["s4_failover_s"] = round(time.time() - killed_at, 1)
        # the Service's own address now reaches the backup's pods (kube-proxy follows the selector)
        direct = [httpx.post(f"{svc(cluster, 'digits')}/predict", json={"inputs": [pools["clean"][0][0].tolist()]},
                             timeout=10).status_code for _ in range(10)]
        result["s4_direct_after_route"] = direct
        on_backup = traffic.count()
        wait_for(lambda: traffic.count() > on_backup + 20, 60, "traffic served after the failover")
    result["s4_requests"] = traffic.count()
    result["s4_failed"] = len(traffic.failed())
    result["s4_failed_samples"] = [str(a) for a in traffic.failed()[:5]]


if __name__ == "__main__":
    sys.exit(main())
