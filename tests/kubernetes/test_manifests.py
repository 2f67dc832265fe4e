"""Manifests: pure decisions, schema validity (K8s 1.33 strict), RBAC least privilege, compose file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.platform import manifests as mf
from scanflow.spec import Affinity, Job, Resources, load_workflow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = Path(__file__).with_name("workflow.yaml")
K8S_VERSION = "1.33.0"


def validate_all(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("cores", "qty"), [(1.0, "1"), (0.5, "500m"), (2.25, "2250m"), (0.0011, "2m")])
def test_cpu_quantity_never_rounds_down(cores: float, qty: str) -> None:
    assert mf.cpu_quantity(cores) == qty


def test_pinned_is_guaranteed_with_integer_cpus() -> None:
    block = mf.resources_block(Resources(cpu=1.2, memory="1Gi"), Affinity(policy="pinned"))
    assert block == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert mf.qos_class([block]) == "Guaranteed" and mf.has_integer_cpus(block)
    # policy none: a CPU limit too, so the replica's thread pool follows its cgroup limit
    assert mf.resources_block(Resources(cpu=1.5))["limits"]["cpu"] == "1500m"
    assert mf.qos_class([mf.resources_block(Resources(cpu=1.5))]) == "Guaranteed"
    assert mf.qos_class([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}]) == "Burstable"
    assert mf.qos_class([{}]) == "BestEffort"


@pytest.mark.parametrize(
    ("version", "cur_policy", "new_cpu", "new_policy", "method", "why"),
    [
        ((1, 34), "none", 2.0, "none", "in-place", "supports"),
        ((1, 32), "none", 2.0, "none", "rolling-update", "< 1.33"),
        ((1, 35), "none", 2.0, "pinned", "rolling-update", "static CPU manager"),
        ((1, 35), "pinned", 3.0, "pinned", "rolling-update", "static CPU manager"),
    ],
)
def test_choose_resize_method(version, cur_policy, new_cpu, new_policy, method, why) -> None:
    cur = mf.resources_block(Resources(cpu=1), Affinity(policy=cur_policy))
    new = mf.resources_block(Resources(cpu=new_cpu), Affinity(policy=new_policy))
    plan = mf.choose_resize_method(version, cur, new, cur_policy, new_policy)
    assert plan.method == method and why in plan.reason


def test_generated_manifests_validate_and_keep_secrets_out() -> None:
    wf = load_workflow(WORKFLOW)
    docs = mf.workflow_manifests(wf)
    docs.append(mf.batch_job(wf.job("train"), "train-abc123", params={"db_password": "x", "lr": 0.1}))
    validate_all(docs)
    text = yaml.safe_dump_all(docs)
    assert "db_password" not in text
    pinned = docs[2]["spec"]["template"]["spec"]
    assert pinned["containers"][0]["resources"]["limits"]["cpu"] == "2"
    assert pinned["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    for doc in docs:
        for c in doc["spec"].get("template", {}).get("spec", {}).get("containers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            token = next(e for e in c["env"] if e["name"] == "SCANFLOW_TOKEN")
            assert "value" not in token and token["valueFrom"]["secretKeyRef"]["key"] == "token"


def test_cli_dry_run_prints_the_generated_manifests() -> None:
    result = CliRunner().invoke(app, ["deploy", str(WORKFLOW), "--platform", "kubernetes", "--dry-run",
                                      "--namespace", "ml"])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs] == [
        ("Deployment", "digits", "ml"), ("Service", "digits", "ml"),
        ("Deployment", "digits-backup", "ml"), ("Service", "digits-backup", "ml")]
    validate_all(docs)


def test_cli_refuses_a_bad_workflow_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\n")
    result = CliRunner().invoke(app, ["deploy", str(bad), "--platform", "kubernetes", "--dry-run"])
    assert result.exit_code == 2 and "name" in result.output


def kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: cannot run `kubectl kustomize`")
    out = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy" / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_kustomize_overlays_validate(overlay: str) -> None:
    docs = kustomize(overlay)
    validate_all(docs)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Role", "RoleBinding", "ServiceAccount", "StatefulSet", "Deployment"} <= kinds
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    assert {"mlflow", "tracker", "checker", "planner", "executor", "digits", "digits-gateway"} <= names
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
            for c in pod["containers"]:
                for e in c.get("env", []):  # secrets only by reference
                    if any(w in e["name"].lower() for w in ("token", "password")):
                        assert "valueFrom" in e, (d["metadata"]["name"], e["name"])
    mlflow = next(d for d in docs if d["metadata"]["name"] == "mlflow" and d["kind"] == "Deployment")
    assert any(a.startswith("--allowed-hosts=") for a in mlflow["spec"]["template"]["spec"]["containers"][0]["args"])


def test_role_is_namespaced_least_privilege() -> None:
    docs = kustomize("prod")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["metadata"]["namespace"] == "scanflow"
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert "nonResourceURLs" not in rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
    executor = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "executor")
    assert executor["spec"]["template"]["spec"]["serviceAccountName"] == "scanflow-executor"
    others = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] != "executor"]
    assert all(d["spec"]["template"]["spec"].get("automountServiceAccountToken") is False for d in others)


def role_grants() -> set[tuple[str, str]]:
    role = next(d for d in yaml.safe_load_all((ROOT / "deploy/base/rbac.yaml").read_text()) if d["kind"] == "Role")
    return {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}


def test_docker_compose_file_parses() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose (Debian package) not installed: run `make sysdeps` as root")
    done = subprocess.run([compose, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"mlflow", "postgres", "tracker", "checker", "planner", "executor", "digits",
            "digits-gateway"} <= set(cfg["services"])
    assert any(a.startswith("--allowed-hosts=") for a in cfg["services"]["mlflow"]["command"])


def test_job_manifest_runs_module_functions_through_jobrunner() -> None:
    body = mf.batch_job(Job(name="train", entrypoint="pkg.mod:fn", timeout_s=90.5), "train-1")
    assert body["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "scanflow.platform.jobrunner", "pkg.mod:fn"]
    assert body["spec"]["activeDeadlineSeconds"] == 91


def test_job_manifest_names_the_platforms_mlflow_run() -> None:
    def env(body: dict) -> dict:  # type: ignore[type-arg]
        return {e["name"]: e.get("value") for e in body["spec"]["template"]["spec"]["containers"][0]["env"]}

    job = Job(name="train", entrypoint="pkg.mod:fn")
    assert env(mf.batch_job(job, "train-1", run_id="abc123"))["MLFLOW_RUN_ID"] == "abc123"
    assert "MLFLOW_RUN_ID" not in env(mf.batch_job(job, "train-1"))  # no run: the job runner opens its own
