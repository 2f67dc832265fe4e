"""Manifests: pure decisions, schema validity (K8s 1.33 strict), RBAC least privilege, compose file."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.platform import k8s_resources as kr
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
    assert kr.cpu_quantity(cores) == qty


def test_pinned_is_guaranteed_with_integer_cpus() -> None:
    block = kr.resources_block(Resources(cpu=1.2, memory="1Gi"), Affinity(policy="pinned"))
    assert block == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert kr.qos_class([block]) == "Guaranteed" and kr.has_integer_cpus(block)
    # policy none: a CPU limit too, so the replica's thread pool follows its cgroup limit
    assert kr.resources_block(Resources(cpu=1.5))["limits"]["cpu"] == "1500m"
    assert kr.qos_class([kr.resources_block(Resources(cpu=1.5))]) == "Guaranteed"
    assert kr.qos_class([{"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}]) == "Burstable"
    assert kr.qos_class([{}]) == "BestEffort"


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
    cur = kr.resources_block(Resources(cpu=1), Affinity(policy=cur_policy))
    new = kr.resources_block(Resources(cpu=new_cpu), Affinity(policy=new_policy))
    plan = kr.choose_resize_method(version, cur, new, cur_policy, new_policy)
    assert plan.method == method and why in plan.reason


def test_generated_manifests_validate_and_keep_secrets_out() -> None:
    wf = load_workflow(WORKFLOW)
    docs = mf.workflow_manifests(wf)
    docs.append(mf.batch_job(wf.job("train"), "train-abc123", params={"db_password": "x", "lr": 0.1}))
    validate_all(docs)
    text = yaml.safe_dump_all(docs)
    assert "db_password" not in text
    assert [d["kind"] for d in docs[:3]] == ["Deployment", "Service", "Service"]  # routable + own
    pinned = [d for d in docs if d["kind"] == "Deployment"][1]["spec"]["template"]["spec"]
    assert pinned["containers"][0]["resources"]["limits"]["cpu"] == "2"
    assert pinned["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    for doc in docs:
        for c in doc["spec"].get("template", {}).get("spec", {}).get("containers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            env = {e["name"]: e for e in c["env"]}
            password = env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"]
            if doc["kind"] == "Job":  # a Job's own MLflow login (role job: no champion move), no agent token
                assert "SCANFLOW_TOKEN" not in env and env["MLFLOW_TRACKING_USERNAME"]["value"] == "job"
                assert password == "job-mlflow-password"
            else:  # a replica: the replica's token (predictions only) and a read-only login
                assert env["SCANFLOW_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "replica-token"
                assert env["MLFLOW_TRACKING_USERNAME"]["value"] == "replica" and password == "replica-mlflow-password"
                assert env["SCANFLOW_AUTH_TOKENS"]["valueFrom"]["secretKeyRef"]["key"] == "auth-tokens"
            assert not [e for e in c["env"] if e["name"] in SECRET_VARS and "value" in e]


def test_cli_dry_run_prints_the_generated_manifests() -> None:
    result = CliRunner().invoke(app, ["deploy", str(WORKFLOW), "--platform", "kubernetes", "--dry-run",
                                      "--namespace", "ml"])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs] == [
        ("Deployment", "digits", "ml"), ("Service", "digits", "ml"), ("Service", "digits-own", "ml"),
        ("Deployment", "digits-backup", "ml"), ("Service", "digits-backup", "ml"),
        ("Service", "digits-backup-own", "ml")]
    validate_all(docs)


def test_cli_refuses_a_bad_workflow_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\n")
    result = CliRunner().invoke(app, ["deploy", str(bad), "--platform", "kubernetes", "--dry-run"])
    assert result.exit_code == 2 and "name" in result.output


# in-place resize beta (1.33) and GA (1.35), and every release since that kubernetes-validate ships
# schemas for (offline: this needs no network)
K8S_SCHEMAS = ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0")
NAMESPACED = {"Deployment", "StatefulSet", "Service", "Secret", "ConfigMap", "ServiceAccount", "Role",
              "RoleBinding", "PersistentVolumeClaim", "PodDisruptionBudget", "NetworkPolicy", "Job"}
AGENTS = ("tracker", "checker", "planner", "executor")
# variables that hold a secret: only ever by secretKeyRef
SECRET_VARS = {"SCANFLOW_TOKEN", "SCANFLOW_AUTH_TOKENS", "MLFLOW_TRACKING_PASSWORD", "POSTGRES_PASSWORD",
               "SCANFLOW_MLFLOW_USERS", "STORE_PASSWORD",
               *(f"{a.upper()}_STORE_PASSWORD" for a in AGENTS)}


def kustomize(overlay: str, tmp_path: Path | None = None) -> list[dict[str, Any]]:
    """`kubectl kustomize` of an overlay. The dev overlay needs secrets.env, which is never committed:
    with `tmp_path`, a copy of deploy/ gets one from gen-secrets.sh first (as `make dev-secrets` does)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: cannot run `kubectl kustomize`")
    root = ROOT / "deploy"
    if overlay == "dev":
        assert tmp_path is not None, "the dev overlay needs a tmp_path for its generated secrets"
        root = tmp_path / "deploy"
        shutil.copytree(ROOT / "deploy", root, ignore=shutil.ignore_patterns("secrets.env"))
        subprocess.run(["sh", str(root / "overlays/dev/gen-secrets.sh")], check=True, capture_output=True,
                       env={**os.environ, "PYTHON": sys.executable})
    out = subprocess.run([kubectl, "kustomize", str(root / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    tmpl = doc["spec"].get("template") or doc["spec"].get("jobTemplate", {}).get("spec", {}).get("template", {})
    return list((tmpl.get("spec") or {}).get("containers") or [])


@pytest.mark.parametrize("overlay", ["dev", "prod", "kind"])
def test_kustomize_overlays_validate(overlay: str, tmp_path: Path) -> None:
    docs = kustomize(overlay, tmp_path)
    if overlay == "kind":  # prod with the image kind loads: every scanflow container runs it
        images = {c["image"] for d in docs if d["kind"] in ("Deployment", "Job") for c in containers(d)}
        assert images == {"scanflow:dev"}, images
        assert {d["kind"] for d in docs} >= {"NetworkPolicy", "PodDisruptionBudget"}
    for version in K8S_SCHEMAS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Role", "RoleBinding", "ServiceAccount", "StatefulSet", "Deployment", "Job"} <= kinds
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    assert {"mlflow", *AGENTS, "digits-gateway"} <= names
    # the Executor owns the inference replicas: kustomize (or GitOps) must not, or it undoes a failover
    assert not {"digits", "digits-backup"} & names
    assert "digits" not in {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
            for c in pod["containers"]:
                for e in c.get("env", []):  # secrets only by reference
                    if e["name"] in SECRET_VARS:
                        assert "valueFrom" in e, (d["metadata"]["name"], e["name"])
                assert not any("password" in str(a).lower() or "postgresql://" in str(a)
                               for a in c.get("command", []) + c.get("args", [])), "a secret in argv"
    mlflow = next(d for d in docs if d["metadata"]["name"] == "mlflow" and d["kind"] == "Deployment")
    ml = mlflow["spec"]["template"]["spec"]["containers"][0]
    assert any(a.startswith("--allowed-hosts=") for a in ml["args"])
    assert "--host=127.0.0.1" in ml["args"] and not ml.get("ports")  # the pod's loopback only
    backend = next(e["value"] for e in ml["env"] if e["name"] == "MLFLOW_BACKEND_STORE_URI")
    # the driver the image installs: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3
    assert backend.startswith("postgresql+psycopg2://")
    assert ml["startupProbe"]["failureThreshold"] * ml["startupProbe"]["periodSeconds"] >= 300


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_namespaced_object_names_its_namespace(overlay: str, tmp_path: Path) -> None:
    for d in kustomize(overlay, tmp_path):
        if d["kind"] in NAMESPACED:
            assert d["metadata"].get("namespace") == "scanflow", (d["kind"], d["metadata"]["name"])


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_agents_are_wired_by_configuration_and_single_instance(overlay: str, tmp_path: Path) -> None:
    docs = kustomize(overlay, tmp_path)
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for role in AGENTS:
        dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == role)
        assert dep["spec"]["strategy"] == {"type": "Recreate"}, role  # never two Executors at once
        c = dep["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        peers = dict(p.split("=", 1) for p in env["SCANFLOW_PEERS"]["value"].split(","))
        assert set(peers) == set(AGENTS)
        for url in peers.values():  # a Service DNS name of this install, never loopback
            host = url.split("//")[1].split(":")[0]
            assert host in services and "127.0.0.1" not in url
        assert env["SCANFLOW_WORKFLOW"]["value"].startswith("/app/workflows/")
        assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        names = [e["name"] for e in c["env"]]  # $(STORE_PASSWORD) expands only if defined earlier
        assert names.index("STORE_PASSWORD") < names.index("SCANFLOW_STORE_URL")
        # its own database role's password, never the superuser's (least privilege)
        assert env["STORE_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == f"{role}-store-password"
        assert "POSTGRES_PASSWORD" not in names
        # every overlay: a durable store (a pod that moves keeps its decisions and its inbox's dedupe)
        store = env["SCANFLOW_STORE_URL"]["value"]
        assert store == f"postgresql+psycopg2://agent_{role}:$(STORE_PASSWORD)@postgres:5432/agents_{role}"
    checker = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "checker")
    env = {e["name"]: e.get("value") for e in checker["spec"]["template"]["spec"]["containers"][0]["env"]}
    # every gateway pod (headless): the Checker sums their counters (scanflow.agentkit.gateways)
    assert env["SCANFLOW_SERVICE_URLS"] == "digits=http://digits-gateway-pods:8080"
    assert env["SCANFLOW_GATEWAY_DISCOVERY"] == "dns"
    executor = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "executor")
    env = {e["name"]: e for e in executor["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCANFLOW_TRACKER_URL"]["value"] == "http://tracker:8080"
    assert env["SCANFLOW_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["SCANFLOW_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    gateway = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "digits-gateway")
    gw = gateway["spec"]["template"]["spec"]["containers"][0]
    assert gw["readinessProbe"]["httpGet"]["path"] == "/ready"
    gw_env = {e["name"]: e.get("value") for e in gw["env"]}
    assert gw_env["SCANFLOW_UPSTREAM"] == "http://digits-own:8080"  # the Services the Executor creates
    assert gw_env["SCANFLOW_BACKUP"] == "http://digits-backup-own:8080"
    assert gw_env["SCANFLOW_UPSTREAM_DISCOVERY"] == "dns"  # digits-own is headless: one upstream per pod
    # the postgres init script creates every agent's database
    init = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("postgres-init"))
    assert all(f"agents_{r}" in init["data"]["10-agents.sql"] for r in AGENTS)


def test_dev_overlay_has_no_default_token(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    root = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", root, ignore=shutil.ignore_patterns("secrets.env"))
    done = subprocess.run([kubectl, "kustomize", str(root / "overlays/dev")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "secrets.env" in done.stderr  # no file, no Secret: no silent default
    docs = kustomize("dev", tmp_path / "gen")
    secret = next(d for d in docs if d["kind"] == "Secret")
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert "token" not in values  # no single shared token any more
    creds = [v for k, v in values.items() if k.endswith(("-token", "-mlflow-password"))]
    assert len(creds) >= 10 and len(set(creds)) == len(creds)  # one each, none shared
    assert all(len(v) >= 32 and "change-me" not in v for v in creds)
    for path in (ROOT / "deploy").rglob("*.yaml"):
        assert "change-me" not in path.read_text(), path


def test_prod_network_policies_fence_mlflow_and_replicas() -> None:
    docs = kustomize("prod")
    pols = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    assert pols["default-deny-ingress"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}

    def sources(name: str) -> set[str]:
        out: set[str] = set()
        for rule in pols[name]["spec"]["ingress"]:
            for peer in rule["from"]:
                sel = peer["podSelector"]
                out |= set((sel.get("matchLabels") or {}).values())
                for expr in sel.get("matchExpressions") or []:
                    out |= set(expr["values"])
        return out

    replicas = next(p for p in pols.values() if p["spec"]["podSelector"].get("matchLabels", {}).get(
        "app.kubernetes.io/component") == "replica")
    # the gateway, and the Checker (component agent AND name checker: no other agent) for /metrics
    assert [peer["podSelector"]["matchLabels"] for rule in replicas["spec"]["ingress"] for peer in rule["from"]] == [
        {"app.kubernetes.io/component": "gateway"},
        {"app.kubernetes.io/component": "agent", "app.kubernetes.io/name": "checker"}]
    mlflow = next(p for p in pols.values() if p["spec"]["podSelector"].get("matchLabels", {}).get(
        "app.kubernetes.io/name") == "mlflow")
    assert sources(mlflow["metadata"]["name"]) == {"agent", "replica", "job"}
    # the labels the policies select on are the ones the Executor's manifests carry
    assert mf.labels("digits")["app.kubernetes.io/component"] == "replica"
    assert mf.batch_job(Job(name="t", entrypoint="m:f"), "t-1")["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/component"] == "job"


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


def test_docker_compose_file_parses_and_requires_its_secrets() -> None:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose (Debian package) not installed: run `make sysdeps` as root")
    from scanflow.deploy_secrets import env_name, generate

    creds = {env_name(k): v for k, v in generate().items()}  # one per component (test_deploy_credentials)
    base_env = {k: v for k, v in os.environ.items() if k not in creds}
    missing = subprocess.run([compose, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT, check=False, env=base_env)
    assert missing.returncode != 0 and "set " in missing.stderr  # no default token or password
    done = subprocess.run([compose, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
                          env={**base_env, **creds})
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svcs = cfg["services"]
    assert {"mlflow", "mlflow-server", "postgres", "bootstrap", *AGENTS} <= set(svcs)
    assert any(a.startswith("--allowed-hosts=") for a in svcs["mlflow-server"]["command"])
    assert not any("postgresql" in a for a in svcs["mlflow-server"]["command"])  # the password stays out of argv
    assert svcs["mlflow-server"]["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://")
    env = cfg["x-scanflow"]["environment"]
    peers = dict(p.split("=", 1) for p in env["SCANFLOW_PEERS"].split(","))
    assert all(url.split("//")[1].split(":")[0] in svcs for url in peers.values())
    watched = dict(p.split("=", 1) for p in env["SCANFLOW_SERVICE_URLS"].split(","))
    assert watched["digits"].startswith("http://executor:")  # the Executor serves what it deploys
    published = svcs["executor"]["ports"][0]
    assert published.endswith(":" + watched["digits"].rsplit(":", 1)[1])
    for name in AGENTS:
        assert "agents_" + name in str(svcs[name]["environment"]["SCANFLOW_STORE_URL"])


def test_dockerfile_installs_dependencies_before_copying_the_source() -> None:
    lines = [ln.strip() for ln in (ROOT / "deploy/Dockerfile").read_text().splitlines()]
    first_source = next(i for i, ln in enumerate(lines) if ln.startswith("COPY scanflow"))
    deps = next(i for i, ln in enumerate(lines) if "pip install '.[postgres,k8s]'" in ln)  # the driver, the client
    assert deps < first_source  # a code change reuses the dependency layer
    assert any("/mlartifacts" in ln and "10001" in ln for ln in lines)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".bench-peers", ".git", ".scanflow", "mlruns"} <= set(ignored)  # no environment in the context
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("psycopg2-binary==") for d in extras["postgres"])  # pinned
    assert any(d.startswith("kubernetes") for d in extras["k8s"])  # the Executor in a pod needs the client


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
