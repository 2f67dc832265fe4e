"""Contracts between the container manifests and the processes they start.

deploy/base/*.yaml, docker-compose.yml and `scanflow.platform.manifests` configure replicas, the
gateway and agents by command line AND env (SCANFLOW_HOST=0.0.0.0, SCANFLOW_THREADS, SCANFLOW_UPSTREAM,
SCANFLOW_PLATFORM ...). Each container's command is parsed here with the real parser of the process it
starts, under the env the manifest gives it, and the outcome is checked (listens on 0.0.0.0:8080, finds
its upstream, picks the platform): a renamed flag or an env var nobody reads fails these tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from scanflow.agent.sources import is_module_ref, module_file
from scanflow.platform import manifests as mf
from scanflow.serving import gateway, gateway_args, gateway_server, replica, replica_args, replica_server
from scanflow.settings import Settings
from scanflow.spec import Job, Resources, load_workflow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "tests/kubernetes/workflow.yaml"


def _literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env with literal values (secretKeyRef / fieldRef ones get a placeholder)."""
    out: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            out[e["name"]] = str(e["value"])
        elif "fieldRef" in (e.get("valueFrom") or {}):
            out[e["name"]] = "scanflow"  # metadata.namespace in deploy/base
        else:
            out[e["name"]] = "from-secret"
    return out


def _containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    for doc in docs:
        if doc.get("kind") not in ("Deployment", "Job"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            yield f"{doc['metadata']['name']}/{c['name']}", list(c["command"]), _literal_env(c)


def _base_docs() -> list[dict[str, Any]]:
    return [d for f in sorted((ROOT / "deploy/base").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _compose_containers() -> Iterator[tuple[str, list[str], dict[str, str]]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, svc in compose["services"].items():
        if "command" in svc:
            env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
            yield f"compose/{name}", [str(a) for a in svc["command"]], env


def serve_envvars() -> set[str]:
    """Every env var the replica's and the gateway's options read, and the service's record key."""
    from scanflow.tracking.record_ids import SERVICE_RECORD_KEY_ENV

    names = {SERVICE_RECORD_KEY_ENV}
    for app in (replica_args.app, gateway_args.app):
        names |= {p.envvar for p in typer.main.get_command(app).params if isinstance(p.envvar, str)}
    return names


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Make `env` the only serve env vars set: the processes read their env defaults from os.environ."""
    for name in serve_envvars():
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def _parse_cli(argv: list[str]) -> Any:
    """Parse `scanflow ...` argv with the real typer command tree, without running the command.

    (typer >= 0.20 vendors its own click, so groups are recognised by their `commands`.)
    """
    from scanflow.cli import app

    cmd: Any = typer.main.get_command(app)
    args = list(argv)
    while isinstance(getattr(cmd, "commands", None), dict):
        sub = cmd.commands.get(args[0])
        assert sub is not None, f"`scanflow` has no command {args[0]!r} (argv {argv})"
        cmd, args = sub, args[1:]
    return cmd.make_context(cmd.name or "scanflow", args)


def check_container(name: str, command: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Parse one container command the way its process will; return what kind of process it is."""
    if command[:3] == ["python", "-m", "scanflow.serving.replica"]:
        use_env(monkeypatch, env)
        args = replica.parse_args(command[3:])
        assert (args.host, args.port) == ("0.0.0.0", 8080), name
        assert args.model_uri.startswith("models:/"), name
        if "SCANFLOW_THREADS" in env:
            assert args.threads == int(env["SCANFLOW_THREADS"]) and not args.threads_pinned, name
        if "SCANFLOW_SERVICE" in env:
            assert args.service == env["SCANFLOW_SERVICE"], name
        return "replica"
    if command[:3] == ["python", "-m", "scanflow.serving.gateway"]:
        use_env(monkeypatch, env)
        args = gateway.parse_args(command[3:])
        assert (args.host, args.port) == ("0.0.0.0", 8080), name
        assert args.replica, f"{name}: the gateway would start with no replica to send to"
        return "gateway"
    if command[:3] == ["python", "-m", "scanflow.platform.jobrunner"]:
        from scanflow.platform.jobrunner import load_entrypoint

        assert len(command) == 4 and "SCANFLOW_JOB_PARAMS" in env, f"{name}: params come by env"
        load_entrypoint(command[3])
        return "job"
    if command[:3] == ["scanflow", "agent", "run"]:
        ctx = _parse_cli(command[1:])
        source = str(ctx.params["file"])  # a module of the installed package: the image has no source tree
        assert is_module_ref(source), f"{name}: {source} names a path; the image serves the installed package"
        assert module_file(source).is_relative_to(ROOT / "scanflow"), f"{name}: {source} is not scanflow's"
        assert ctx.params["port"] == 8080, name
        for key in list(Settings.model_fields):
            monkeypatch.delenv(f"SCANFLOW_{key.upper()}", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        settings = Settings()  # a malformed SCANFLOW_PEERS / SCANFLOW_SERVICE_URLS raises here
        assert (ctx.params["host"] or settings.host) == "0.0.0.0", name
        assert settings.peers and all("127.0.0.1" not in u for u in settings.peers.values()), name
        workflow = env.get("SCANFLOW_WORKFLOW", "").removeprefix("/app/")
        assert workflow and (ROOT / workflow).is_file(), f"{name}: SCANFLOW_WORKFLOW is not in the image"
        if source.startswith("scanflow.standard.executor"):
            assert settings.platform == env.get("SCANFLOW_PLATFORM", "local"), name
            assert env.get("SCANFLOW_PLATFORM") != "kubernetes" or settings.namespace, name
        return "agent"
    if command[:3] == ["python", "-m", "scanflow.embedded.bootstrap"]:
        assert command[3] == "--workflow" and len(command) == 5, f"{name}: {command}"
        path = command[4].removeprefix("/app/")  # the image's WORKDIR holds the repository's workflows/
        assert (ROOT / path).is_file(), f"{name}: {command[4]} is not in the image"
        load_workflow(ROOT / path)
        return "bootstrap"
    if command[0] == "mlflow":
        return "mlflow"  # MLflow's own CLI, not ours
    if command[:3] == ["scanflow", "mlflow", "proxy"]:
        ctx = _parse_cli(command[1:])
        assert ctx.params["host"] == "0.0.0.0" and ctx.params["upstream"], name
        assert "SCANFLOW_MLFLOW_USERS" in env, f"{name}: the proxy's logins come by env"
        return "mlflow-proxy"
    raise AssertionError(f"{name}: unknown container command {command}")


def test_deploy_base_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = [check_container(n, c, e, monkeypatch) for n, c, e in _containers(_base_docs())]
    # no replica: the Executor creates those (test_generated_manifests_parse checks their commands)
    assert sorted(set(kinds)) == ["agent", "bootstrap", "gateway", "mlflow", "mlflow-proxy"]
    assert kinds.count("agent") == 4


def test_compose_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = [check_container(n, c, e, monkeypatch) for n, c, e in _compose_containers()]
    # the Executor runs the gateway and replicas inside its container (its local platform)
    assert sorted(set(kinds)) == ["agent", "bootstrap", "mlflow", "mlflow-proxy"]


def test_generated_manifests_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    wf = load_workflow(WORKFLOW)
    docs = mf.workflow_manifests(wf)
    job = Job(name="train", entrypoint="scanflow.examples.digits.train:train", resources=Resources(cpu=1, memory="1Gi"))
    docs.append(mf.batch_job(job, "train-1"))
    kinds = [check_container(n, c, e, monkeypatch) for n, c, e in _containers(docs)]
    assert "replica" in kinds and "job" in kinds


def test_probes_are_truthful_on_the_http_port() -> None:
    """Replicas and gateways: readiness and start-up on GET /ready (the model is loaded / a replica is
    healthy), liveness on /health; agents: start-up and liveness on /health (served only after their
    start-up), readiness on /ready (their store answers). Port 'http' = 8080."""
    for doc in _base_docs() + mf.workflow_manifests(load_workflow(WORKFLOW)):
        if doc.get("kind") != "Deployment" or doc["metadata"]["name"] in ("mlflow", "postgres"):
            continue
        agent = doc["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
        for c in doc["spec"]["template"]["spec"]["containers"]:
            http = [pt for pt in c["ports"] if pt.get("name") == "http"]
            assert [pt["containerPort"] for pt in http] == [8080], doc["metadata"]["name"]
            start = "/health" if agent else "/ready"
            for probe, path in (("readinessProbe", "/ready"), ("startupProbe", start), ("livenessProbe", "/health")):
                assert c[probe]["httpGet"] == {"path": path, "port": "http"}, (doc["metadata"]["name"], probe)
    rep = replica_server.create_app(replica_server.ReplicaConfig(model_uri="models:/x@champion", cpu_watch_s=0))
    gw = gateway_server.create_app(gateway_server.GatewayConfig())
    for api in (rep.api, gw.api):
        assert {"/health", "/ready"} <= {getattr(r, "path", "") for r in api.routes}


def test_flags_win_over_env_and_bad_env_names_the_variable(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    use_env(monkeypatch, {"SCANFLOW_HOST": "0.0.0.0", "SCANFLOW_THREADS": "3",
                          "SCANFLOW_UPSTREAM": "http://a:1, http://b:2"})
    args = replica.parse_args(["--model-uri", "m", "--port", "1", "--host", "127.0.0.1", "--threads", "2"])
    assert (args.host, args.threads, args.threads_pinned) == ("127.0.0.1", 2, True)
    assert gateway.parse_args(["--port", "1"]).replica == ["http://a:1", "http://b:2"]
    assert gateway.parse_args(["--port", "1", "--replica", "http://c:3"]).replica == ["http://c:3"]
    use_env(monkeypatch, {"SCANFLOW_THREADS": "four"})
    with pytest.raises(SystemExit) as exc:
        replica.parse_args(["--model-uri", "m", "--port", "1"])
    assert exc.value.code == 2 and "'--threads' (env var: 'SCANFLOW_THREADS')" in capsys.readouterr().err
    use_env(monkeypatch, {})
    with pytest.raises(SystemExit) as exc:
        replica.parse_args(["--port", "1"])  # no model URI anywhere
    assert exc.value.code == 2 and "--model-uri (or SCANFLOW_MODEL_URI) is required" in capsys.readouterr().err


def test_compose_scrape_targets_are_listening_services() -> None:
    """deploy/observability/prometheus.yml names only what docker-compose.yml runs: agents on their
    --port, and the gateways the Executor's container serves (SCANFLOW_SERVICE_URLS)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    listening: dict[str, tuple[str, str]] = {}  # host:port -> (component, service)
    for name, svc in compose["services"].items():
        command = [str(a) for a in svc.get("command") or []]
        if command[:3] == ["scanflow", "agent", "run"]:
            listening[f"{name}:{command[command.index('--port') + 1]}"] = (name, "")
    env = compose["services"]["checker"]["environment"]
    for item in str(env["SCANFLOW_SERVICE_URLS"]).split(","):
        service, url = item.split("=", 1)
        listening[url.removeprefix("http://")] = ("gateway", service)
    config = yaml.safe_load((ROOT / "deploy/observability/prometheus.yml").read_text())
    targets = {t: (sc["labels"]["component"], sc["labels"].get("service", ""))
               for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == listening
