"""Issue #15 in the deployments: MLflow behind its authenticating proxy (Kubernetes and compose), one
credential per component (none shared, none literal), and the manifest's MLflow + proxy command lines
run as real processes hold the roles."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scanflow import deploy_secrets as ds
from scanflow.platform import manifests as mf
from scanflow.platform.processes import free_port
from scanflow.spec import load_workflow
from tests.kubernetes.test_manifests import ROOT, SECRET_VARS, WORKFLOW, kustomize

CREDENTIAL_VARS = ("SCANFLOW_TOKEN", "MLFLOW_TRACKING_PASSWORD")


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


def secret_key(env: dict[str, Any], name: str) -> str | None:
    e = env.get(name)
    return None if e is None else e["valueFrom"]["secretKeyRef"]["key"]


def workloads(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(component name, container) of every workload: the kustomized ones and what the Executor creates."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in pod_containers(d):
                yield f"{d['metadata']['name']}/{c['name']}", c
    wf = load_workflow(WORKFLOW)
    for d in mf.workflow_manifests(wf):
        if d["kind"] == "Deployment":
            yield "executor-made replicas", pod_containers(d)[0]  # every service's replicas: one component
    yield "executor-made job", pod_containers(mf.batch_job(wf.job("train"), "train-1"))[0]


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_mlflow_binds_loopback_and_the_service_targets_the_proxy(overlay: str, tmp_path: Path) -> None:
    docs = kustomize(overlay, tmp_path)
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    cs = {c["name"]: c for c in pod_containers(dep)}
    ml, proxy = cs["mlflow"], cs["proxy"]
    assert "--host=127.0.0.1" in ml["args"] and not ml.get("ports")
    upstream_port = next(a for a in ml["args"] if a.startswith("--port=")).split("=")[1]
    assert ml["command"] == ["mlflow", "server"]
    assert proxy["command"][:3] == ["scanflow", "mlflow", "proxy"]
    assert f"--upstream=http://127.0.0.1:{upstream_port}" in proxy["command"]
    assert f"--allowed-hosts=127.0.0.1:{upstream_port},localhost:{upstream_port}" in ml["args"]
    assert secret_key({e["name"]: e for e in proxy["env"]}, "SCANFLOW_MLFLOW_USERS") == ds.MLFLOW_USERS_KEY
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "mlflow")
    target = svc["spec"]["ports"][0]["targetPort"]
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert target in ports and str(ports[target]) != upstream_port  # the Service reaches the proxy only


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_component_has_its_own_credentials_by_reference(overlay: str, tmp_path: Path) -> None:
    docs = kustomize(overlay, tmp_path)
    owner: dict[str, str] = {}  # Secret key -> the one component that holds it
    holders = set()
    for name, c in workloads(docs):
        env = {e["name"]: e for e in c.get("env", [])}
        for var in SECRET_VARS & set(env):
            assert "valueFrom" in env[var], (name, var)  # never a literal
        for var in CREDENTIAL_VARS:
            key = secret_key(env, var)
            if key is None:
                continue
            holders.add(name)
            assert owner.setdefault(key, name) == name, f"{key} shared by {owner[key]} and {name}"
            component = key.removesuffix("-token").removesuffix("-mlflow-password")
            assert component in ds.BY_NAME, key
            if var == "MLFLOW_TRACKING_PASSWORD":  # the login name is the component's own
                assert env["MLFLOW_TRACKING_USERNAME"]["value"] == component, name
    for agent in ("tracker", "checker", "planner", "executor"):
        assert f"{agent}/{agent}" in holders
        assert owner[ds.token_key(agent)] == owner[ds.mlflow_password_key(agent)] == f"{agent}/{agent}"
    assert owner["replica-token"].startswith("executor-made") and owner["job-mlflow-password"] == "executor-made job"
    assert owner["bootstrap-mlflow-password"] == "scanflow-bootstrap/bootstrap"
    # a replica's token cannot actuate; a Job holds no agent token and its login cannot move champion
    assert "actuate" not in ds.BY_NAME["replica"].scopes and not ds.BY_NAME["job"].scopes
    assert ds.BY_NAME["job"].mlflow_role == "job" and ds.BY_NAME["replica"].mlflow_role == "reader"


def test_dev_secret_holds_every_key_referenced_and_no_value_leaks(tmp_path: Path) -> None:
    docs = kustomize("dev", tmp_path)
    secret = next(d for d in docs if d["kind"] == "Secret")
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    referenced = {e["valueFrom"]["secretKeyRef"]["key"] for _, c in workloads(docs) for e in c.get("env", [])
                  if "secretKeyRef" in e.get("valueFrom", {})}
    assert referenced <= set(values), referenced - set(values)
    rest = yaml.safe_dump_all([d for d in docs if d["kind"] != "Secret"])
    for key, value in values.items():
        if key.endswith(("-token", "-password")):
            assert value not in rest, key
    assert {e["name"] for e in json.loads(values[ds.AUTH_TOKENS_KEY])} == {c.name for c in ds.COMPONENTS if c.scopes}


# -- compose -----------------------------------------------------------------------------------------


def compose_config(tmp_path: Path, env_file: Path | None) -> subprocess.CompletedProcess[str]:
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose (Debian package) not installed: run `make sysdeps` as root")
    names = {ds.env_name(k) for k in ds.generate(lambda n: "x")}
    base_env = {k: v for k, v in os.environ.items() if k not in names}
    args = [compose, "-f", str(ROOT / "docker-compose.yml")]
    if env_file is not None:
        args += ["--env-file", str(env_file)]
    else:  # an empty file: not the ignored .env a developer may keep in the checkout
        (tmp_path / "empty.env").write_text("")
        args += ["--env-file", str(tmp_path / "empty.env")]
    return subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          check=False, env=base_env)


def test_compose_mlflow_behind_the_proxy_and_a_credential_each(tmp_path: Path) -> None:
    missing = compose_config(tmp_path, None)
    assert missing.returncode != 0 and "set " in missing.stderr  # no default credential
    env_file = tmp_path / ".env"
    assert ds.main(["--format", "compose", str(env_file)]) == 0
    done = compose_config(tmp_path, env_file)
    assert done.returncode == 0, done.stderr
    svcs = yaml.safe_load(done.stdout)["services"]
    server, proxy = svcs["mlflow-server"], svcs["mlflow"]
    assert not server.get("ports") and set(server["networks"]) == {"mlflow-internal"}
    internal = {n for n, s in svcs.items() if "mlflow-internal" in (s.get("networks") or {})}
    assert internal == {"mlflow-server", "mlflow", "postgres"}
    assert proxy["command"][:3] == ["scanflow", "mlflow", "proxy"] and "--upstream=http://mlflow-server:5000" in proxy["command"]
    assert proxy["ports"] and set(proxy["environment"]) == {"SCANFLOW_MLFLOW_USERS"}
    logins = json.loads(proxy["environment"]["SCANFLOW_MLFLOW_USERS"])  # digests, taken literally from .env
    assert {e["name"] for e in logins} == {c.name for c in ds.COMPONENTS if c.mlflow_role}
    assert not {k for k in server["environment"] if "TOKEN" in k or "MLFLOW_TRACKING" in k}
    owner: dict[str, str] = {}
    for name, s in svcs.items():
        env = s.get("environment") or {}
        for var, value in env.items():
            if var.endswith(("_TOKEN", "_PASSWORD")) and var != "POSTGRES_PASSWORD" and value:
                assert owner.setdefault(value, f"{name}:{var}") == f"{name}:{var}", (var, owner[value])
    superuser = svcs["postgres"]["environment"]["POSTGRES_PASSWORD"]
    for agent in ("tracker", "checker", "planner", "executor"):
        assert svcs[agent]["environment"]["MLFLOW_TRACKING_USERNAME"] == agent
        assert svcs[agent]["environment"]["SCANFLOW_TOKEN"]
        # its store as its own database role, never with PostgreSQL's superuser password
        store = svcs[agent]["environment"]["SCANFLOW_STORE_URL"]
        assert store.startswith(f"postgresql+psycopg2://agent_{agent}:") and store.endswith(f"/agents_{agent}")
        assert not any(superuser in str(v) for v in svcs[agent]["environment"].values()), agent
    ex = svcs["executor"]["environment"]
    assert ex["SCANFLOW_REPLICA_TOKEN"] != ex["SCANFLOW_TOKEN"] and ex["SCANFLOW_JOB_MLFLOW_USERNAME"] == "job"
    assert svcs["bootstrap"]["environment"]["MLFLOW_TRACKING_USERNAME"] == "bootstrap"
    assert "SCANFLOW_TOKEN" not in svcs["bootstrap"]["environment"]


# -- the manifest's MLflow + proxy, as real processes -------------------------------------------------


def _wait(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # polling a port: there is no event to await from another process
    raise AssertionError(f"{url} not healthy in {timeout_s} s")


@pytest.fixture(scope="module")
def manifest_mlflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """MLflow and its proxy started with the mlflow pod's command lines (prod overlay), on free loopback
    ports instead of 5001/5000, SQLite instead of PostgreSQL and one worker instead of two (sizing, not
    security: halves the start on a 2-core box); yields (proxy URL, Secret values)."""
    tmp = tmp_path_factory.mktemp("manifest-mlflow")
    docs = kustomize("prod")
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    cs = {c["name"]: c for c in pod_containers(dep)}
    up, front = str(free_port()), str(free_port())

    def local(arg: str) -> str:
        return (arg.replace(":5001", f":{up}").replace("=5001", f"={up}").replace("=5000", f"={front}")
                .replace("/mlartifacts", str(tmp / "artifacts")).replace("--workers=2", "--workers=1"))

    bindir = Path(sys.executable).parent
    ml_argv = [str(bindir / cs["mlflow"]["command"][0]), *cs["mlflow"]["command"][1:], *map(local, cs["mlflow"]["args"])]
    proxy_argv = [sys.executable, "-m", "scanflow.cli", *[local(a) for a in cs["proxy"]["command"][1:]]]
    values = ds.generate()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SCANFLOW_"))}
    ml_env = {**base, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
              "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp / 'mlflow.db'}"}
    proxy_env = {**base, "SCANFLOW_MLFLOW_USERS": values[ds.MLFLOW_USERS_KEY],
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = []
    with open(tmp / "log", "ab") as log:
        try:
            procs.append(subprocess.Popen(ml_argv, env=ml_env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            procs.append(subprocess.Popen(proxy_argv, env=proxy_env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            _wait(f"http://127.0.0.1:{front}/health", procs[1], 240)  # MLflow's /health through the proxy
            yield f"http://127.0.0.1:{front}", values
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 15)
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)


def login(values: dict[str, str], component: str) -> dict[str, str]:
    raw = f"{component}:{values[ds.mlflow_password_key(component)]}".encode()
    return {"Authorization": "Basic " + base64.b64encode(raw).decode()}


@pytest.mark.integration
@pytest.mark.e2e  # starts mlflow server: 30-60 s on a busy 2-core box (as tests/postgres does)
def test_manifest_mlflow_and_proxy_hold_the_roles(manifest_mlflow: tuple[str, dict[str, str]]) -> None:
    url, values = manifest_mlflow
    api = url + "/api/2.0/mlflow"
    assert httpx.post(api + "/registered-models/create", json={"name": "m"}, timeout=30).status_code == 401
    assert httpx.post(api + "/registered-models/create", json={"name": "m"}, timeout=30,
                      headers={"Authorization": "Bearer " + values["tracker-token"]}).status_code == 401
    boot = login(values, "bootstrap")
    assert httpx.post(api + "/registered-models/create", json={"name": "m"}, headers=boot, timeout=30).status_code == 200
    run = httpx.post(api + "/runs/create", json={"experiment_id": "0"}, headers=login(values, "job"), timeout=30)
    assert run.status_code == 200, run.text
    info = run.json()["run"]["info"]
    mv = httpx.post(api + "/model-versions/create", headers=login(values, "job"), timeout=30,
                    json={"name": "m", "source": info["artifact_uri"] + "/model", "run_id": info["run_id"]})
    assert mv.status_code == 200, mv.text
    champion = {"name": "m", "alias": "champion", "version": mv.json()["model_version"]["version"]}
    assert httpx.post(api + "/registered-models/alias", json=champion, headers=login(values, "job"),
                      timeout=30).status_code == 403
    assert httpx.post(api + "/registered-models/alias", json=champion, headers=login(values, "executor"),
                      timeout=30).status_code == 200
    got = httpx.get(api + "/registered-models/alias", params={"name": "m", "alias": "champion"},
                    headers=login(values, "replica"), timeout=30)
    assert got.status_code == 200 and got.json()["model_version"]["version"] == champion["version"]
    assert httpx.post(api + "/registered-models/alias", json=champion, headers=login(values, "replica"),
                      timeout=30).status_code == 403
