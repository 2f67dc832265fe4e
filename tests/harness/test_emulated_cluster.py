"""The dev and prod overlays and docker-compose.yml on the emulated cluster (tests/harness/cluster.py):
every container started with the env and args the rendered manifests give it, Service names resolved
to their own addresses, the Executor driving KubernetesPlatform through kmock. An emulation: it catches wiring, it is no cluster.

The harness runs in `unshare -m -n` (a private mount and network namespace): the host's network and
/etc/hosts are never touched, and everything it made vanishes with it.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cluster import REPLACED, reap

ROOT = Path(__file__).resolve().parents[2]
# one install, wired + S4 + S1, on 2 shared cores: measured 340 s (dev) and 476 s (compose) at load ~12
# the dev overlay's run: ~5 min quiet and up to 16 min at load ~5 before the infeasible resize, which
# adds ~3 min (it waits out the rollout) and up to 2 min for the emulation to settle after it; the
# image bump ~2 min more (the Executor restarts, then each pod rolls in turn)
RUN_TIMEOUT_S = 2100
pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 120)  # the suite's 300 s default is for unit tests


def _missing() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network and mount namespaces)"
    for tool in ("unshare", "nsenter", "ip", "mount", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    for what, path in (("the checkout", ROOT), ("the interpreter", Path(sys.prefix)), ("its base", Path(sys.base_prefix))):
        top = path.resolve().parts[1:2]
        if top and top[0] in REPLACED:
            return (f"{what} lies under /{top[0]} ({path}), which the containers' image root replaces with a fresh "
                    "directory: clone and install under another path (e.g. /srv or $HOME) to run the emulated cluster")
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        return "PostgreSQL server binaries not installed (Debian: apt-get install postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 not installed: pip install '.[postgres]'"
    probe = subprocess.run(["unshare", "-m", "-n", "ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot create veth pairs in a network namespace: {probe.stderr.decode().strip()}"
    return None


def run_harness(tmp_path: Path, overlay: str, scenarios: str) -> dict:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    tool = "docker-compose" if overlay == "compose" else "kubectl"
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed (`make sysdeps` installs docker-compose)")
    if overlay == "prod" and shutil.which("iptables-restore") is None:
        pytest.skip("iptables-restore not installed: the NetworkPolicies cannot be enforced")
    workdir = tmp_path / "cluster"
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(["unshare", "-m", "-n", sys.executable, "-m", "tests.harness", "--overlay", overlay,
                               "--workdir", str(workdir), "--out", str(out), "--scenarios", scenarios],
                              cwd=ROOT, env=env, capture_output=True, timeout=RUN_TIMEOUT_S, check=False)
    finally:
        reap(workdir / "rootfs")  # a container the harness could not stop
    assert out.exists(), proc.stderr.decode(errors="replace")[-5000:]
    result = json.loads(out.read_text())
    assert result["ok"], (f"{result.get('error')}\ndelivery: {result.get('delivery_reasons')}\n{result.get('events')}\n"
                          f"{result.get('logs', '')[-20000:]}")
    return result


def assert_s1_and_s4(r: dict) -> None:
    # S4: the Planner's route is in force, and no request through the gateway failed on the way
    assert r["s4_routed_before"] is False
    assert r["s4_requests"] > 40
    assert r["s4_failed"] == 0, r["s4_failed_samples"]
    # S1: drift -> retrain -> promote -> the replicas serve the new version, with no failed request
    assert int(r["s1_new_version"]) > int(r["s1_old_version"])
    assert r["s1_requests"] > 100
    assert r["s1_failed"] == 0, r["s1_failed_samples"]


def test_dev_overlay_comes_up_wired_then_s4_and_s1_close(tmp_path: Path) -> None:
    r = run_harness(tmp_path, "dev", "wired,s4,s1,resize,upgrade")
    # wired: the Executor created and owns the replicas, with the image of its own pod
    assert r["digits_managed_by"] == "scanflow-executor"
    assert r["digits_image"].startswith("scanflow")
    assert r["peers"]["checker"] == ["executor", "planner", "tracker"]  # SCANFLOW_PEERS, less itself
    assert r["tracker_received"]
    # the gateway's replicas are the digits pods (digits-own is headless, resolved per pod), not a ClusterIP
    assert r["gateway_state_status"] == 200, r
    assert r["gateway_replicas"] == [f"http://{ip}:8080" for ip in r["digits_pod_ips"]], r
    assert_s1_and_s4(r)
    # on Kubernetes: the route is the `digits` Service's selector (its own address then reaches the
    # backup's pods); the retrain ran as a Job the emulated kubelet ran; the replicas rolled onto it
    assert r["s4_direct_after_route"] == [200] * 10
    assert r["s1_jobs"], "no training Job was created"
    assert f"models:/digits/{r['s1_new_version']}" in r["s1_digits_command"]
    # an in-place resize (the emulated kubelet actuates pods/resize): read back by the Executor, the same
    # pods and pod template (no rollout); a replica added afterwards starts from the template at the old
    # size and the Executor resizes it to the new one, still without a template change
    assert r["resize_status"] == "succeeded" and r["resize_method"] == "in-place", r
    assert r["resize_same_pods"] and r["resize_same_template"], r
    assert set(r["resize_pod_cpus"]) == {r["resize_cpu"]}, r
    assert r["resize_in_progress_pods"], r  # reported in progress first, and the Executor waited for it
    assert r["resize_scale_status"] == "succeeded" and r["resize_added_pod"], r
    assert r["resize_template_after_scale"], r
    # a resize beyond the emulated node: Infeasible in place, the rolling update's new pods Unschedulable,
    # the template put back; the step fails, not retried, and says both; then the same pods, at the same
    # size, on the same template
    assert r["infeasible_http"] == 422, r
    assert "infeasible" in r["infeasible_detail"] and "Unschedulable" in r["infeasible_detail"], r
    assert "put back" in r["infeasible_detail"], r
    assert r["infeasible_settled"] and r["infeasible_pod_cpus_kept"], r.get("infeasible_unsettled", r)
    # an image bump in configuration (the Executor's own image): under load through the gateway, every
    # replica of every service the Executor owns rolls onto it, 0 failed requests, replicas and resources
    # kept by the adoption, each roll a decision of the `execute-upgrade` strategy that says what it did
    assert r["upgrade_services"] == ["digits", "digits-backup"], r
    assert r["upgrade_requests"] > 40 and r["upgrade_failed"] == 0, r["upgrade_failed_samples"]
    assert all(all(kept.values()) for kept in r["upgrade_kept"].values()), r["upgrade_kept"]
    # digits was resized in place above: the template kept its size, the rollout's pods were resized to it
    assert r["upgrade_resized_services"] == ["digits"] and r["upgrade_pods_at_resized_size"], r
    assert {o["result"]["service"] for o in r["upgrade_outcomes"] if o.get("status") == "ok"
            and (o.get("result") or {}).get("to") == r["upgrade_image"]} == set(r["upgrade_services"]), r


def test_docker_compose_comes_up_wired_then_s4_and_s1_close(tmp_path: Path) -> None:
    r = run_harness(tmp_path, "compose", "wired,s4,s1")
    assert r["peers"]["executor"] == ["checker", "planner", "tracker"]
    assert r["tracker_received"]
    assert_s1_and_s4(r)


def test_prod_overlay_with_network_policies_enforced_runs_s1_to_s4(tmp_path: Path) -> None:
    """The prod overlay as rendered (the Secret created out of band, the agents' stores on PostgreSQL
    as their own roles, two gateways), with its NetworkPolicies enforced between the pods
    (tests/harness/netpolicy.py) and the containers' CPU limits as cgroups (tests/harness/pod_cgroups.py):
    the loop comes up, fails over, retrains, scales and tunes with every edge it needs, and connections no
    component needs get no answer. (`--scenarios ...,delivery` also delivers S1's challenger progressively:
    not run here, see tests/harness/delivery_scenario.py.)"""
    r = run_harness(tmp_path, "prod", "wired,s4,s1,s2,s3,netpol")
    assert r["digits_managed_by"] == "scanflow-executor" and r["tracker_received"]
    assert r["gateway_replicas"] == [f"http://{ip}:8080" for ip in r["digits_pod_ips"]], r
    assert_s1_and_s4(r)
    # enforced, not only declared: every pod a policy selects has its filter, and the probes agree
    assert {"digits", "digits-gateway", "mlflow", "postgres", "tracker"} <= {
        name.rsplit("-", 2)[0] if name != "postgres-0" else "postgres" for name in r["netpol_firewalled_pods"]}, r
    wrong = [e for e in r["netpol_edges"] if e["connected"] != e["want"]]
    assert not wrong, wrong
    # through a Service address, the policies refused only those probes: the loop itself never hit one
    # (a refused call hangs to its client's timeout)
    assert sorted(r["policy_drops"]) == ["digits -> postgres:5432", "digits-gateway -> mlflow:5000",
                                         "digits-gateway -> postgres:5432"], r["policy_drops"]
    if r.get("tuning_unavailable"):  # counted as a skip by .ci/run, after everything else was checked
        pytest.skip(f"S2 and S3 not run: {r['tuning_unavailable']}")
    # S2 and S3 are the demo's own scenarios and verdicts, through the agents (not the in-process
    # fallback): the Planner's moves on the Checker's observations of both gateways, applied by the Executor
    for name in ("s2", "s3"):
        assert r[name]["passed"], r[name]
    assert r["s2"]["figures"]["mode"] == "agents" and r["s2"]["figures"]["failed"] == 0, r["s2"]
    assert r["s3"]["figures"]["grown_cpu"] and r["s3"]["figures"]["failed"] == 0, r["s3"]
    # the sizes the Executor read back are the ones the kernel holds each replica to
    limits = r["tuning_replica_limits"]
    assert limits and all(v["cgroup"] is not None and v["cgroup"] == pytest.approx(v["status"])
                          for v in limits.values()), limits
