"""`scanflow serve replica|gateway` and `python -m scanflow.serving.replica|gateway` run one typer
command per server (scanflow.serving.replica_args, gateway_args): options declared once, env vars by
`envvar=`. Every option shows its env var in `--help`, an env var and a flag both reach the server's
config (the flag wins), and any command line the platforms give `python -m` means the same through the CLI."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.platform import manifests as mf
from scanflow.platform.processes import free_port
from scanflow.serving import gateway, gateway_args, replica, replica_args
from scanflow.spec import load_workflow
from tests.contracts.test_container_commands import WORKFLOW, _base_docs, _containers, serve_envvars, use_env

MODULES: dict[str, Any] = {"replica": (replica_args, replica), "gateway": (gateway_args, gateway)}
ARGS = {"replica": replica_args.ReplicaArgs, "gateway": gateway_args.GatewayArgs}

# the env vars the platforms and docs/serving.md rely on, per option: a variable dropped or renamed fails here
ENVVARS = {
    "replica": {"model_uri": "SCANFLOW_MODEL_URI", "port": "SCANFLOW_PORT", "host": "SCANFLOW_HOST",
                "threads": "SCANFLOW_THREADS", "max_batch_size": "SCANFLOW_MAX_BATCH_SIZE",
                "max_batch_wait_ms": "SCANFLOW_MAX_BATCH_WAIT_MS", "tracker_url": "SCANFLOW_TRACKER_URL",
                "service": "SCANFLOW_SERVICE", "head_timeout_s": "SCANFLOW_HEAD_TIMEOUT_S",
                "spool_dir": "SCANFLOW_SPOOL_DIR", "log_level": "SCANFLOW_LOG_LEVEL"},
    "gateway": {"port": "SCANFLOW_PORT", "host": "SCANFLOW_HOST", "service": "SCANFLOW_SERVICE",
                "replica": "SCANFLOW_UPSTREAM", "backup": "SCANFLOW_BACKUP",
                "head_timeout_s": "SCANFLOW_HEAD_TIMEOUT_S", "front": "SCANFLOW_GATEWAY_FRONT",
                "upstream_discovery": "SCANFLOW_UPSTREAM_DISCOVERY", "log_level": "SCANFLOW_LOG_LEVEL"},
}

COMMAND_LINES = {
    "replica": [
        ["--model-uri", "models:/digits@champion", "--port", "8123", "--host", "127.0.0.1", "--threads", "2",
         "--max-batch-size", "32", "--max-batch-wait-ms", "2.0", "--service", "digits", "--replica-id", "digits-0",
         "--tracker-url", "http://127.0.0.1:8001", "--spool-dir", "/tmp/spool/digits-0", "--allow-anonymous"],
        ["--model-uri=models:/digits@champion", "--port=8080"],
        ["--model-uri", "runs:/abc/model", "--port", "1", "--max-body-bytes", "1024", "--body-timeout-s", "2.5",
         "--spool-max-mb", "8", "--spool-fsync-s", "0.25", "--allow-local-models", "--cpu-watch-s", "0",
         "--log-level", "DEBUG", "--spool-dir", "none", "--head-timeout-s", "4"],
    ],
    "gateway": [
        ["--port", "8124", "--service", "digits", "--health-interval-s", "0.5", "--backup", "http://127.0.0.1:9",
         "--allow-anonymous"],
        ["--port=8080", "--service=digits", "--replica", "http://a:1", "--replica", "http://b:2",
         "--upstream-discovery", "dns", "--front", "fast"],
        ["--port", "1", "--upstream-timeout-s", "3", "--max-body-bytes", "10", "--body-timeout-s", "1",
         "--coalesce-max", "0", "--batches-per-replica", "2", "--host", "0.0.0.0", "--log-level", "WARNING",
         "--head-timeout-s", "3.5"],
    ],
}


def _platform_command_lines() -> dict[str, list[list[str]]]:
    """The argv of every replica and gateway container deploy/base and the Executor's manifests start."""
    found: dict[str, list[list[str]]] = {"replica": [], "gateway": []}
    docs = _base_docs() + mf.workflow_manifests(load_workflow(WORKFLOW))
    for _, command, _ in _containers(docs):
        for name, lines in found.items():
            if command[:3] == ["python", "-m", f"scanflow.serving.{name}"]:
                lines.append(command[3:])
    return found


def _options(command: Any) -> dict[str, Any]:
    """A click command's options by name (the help option left out)."""
    return {p.name: p for p in command.params if p.name != "help"}


def _serve_command(name: str) -> Any:
    return typer.main.get_command(app).commands["serve"].commands[name]  # type: ignore[attr-defined]


def _through_the_cli(name: str, argv: list[str]) -> Any:
    """The checked arguments `scanflow serve <name> argv` would serve with (ctx.obj takes them instead)."""
    got: list[Any] = []
    result = CliRunner().invoke(app, ["serve", name, *argv], obj=got.append)
    assert result.exit_code == 0, result.output
    (args,) = got
    return args


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_cli_and_python_m_run_one_declaration(name: str) -> None:
    standalone = typer.main.get_command(MODULES[name][0].app)
    cli = _serve_command(name)
    assert cli.callback.__wrapped__ is standalone.callback.__wrapped__ is MODULES[name][0].command
    described = {n: (p.opts, p.default, p.envvar, p.help) for n, p in _options(standalone).items()}
    assert {n: (p.opts, p.default, p.envvar, p.help) for n, p in _options(cli).items()} == described
    fields = {f.name for f in dataclasses.fields(ARGS[name])}
    assert set(described) <= fields, "an option the server's arguments do not carry"


@pytest.mark.parametrize("entry", ["scanflow serve", "python -m"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_option_shows_its_env_var_in_help(name: str, entry: str) -> None:
    command = _serve_command(name) if entry == "scanflow serve" else typer.main.get_command(MODULES[name][0].app)
    assert {n: p.envvar for n, p in _options(command).items() if p.envvar} == ENVVARS[name]
    if entry == "scanflow serve":
        result = CliRunner().invoke(app, ["serve", name, "--help"])
    else:
        result = CliRunner().invoke(MODULES[name][0].app, ["--help"], prog_name=f"python -m {name}")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # help wraps lines at the terminal width
    for option, envvar in ENVVARS[name].items():
        assert f"env var: {envvar}" in text, option
    for option in _options(command).values():
        assert option.opts[0] in text
    if name == "gateway":  # typer lists the choices
        assert "--front <fast|asgi>" in text and "--upstream-discovery <static|dns>" in text


def test_the_docs_table_lists_every_env_var() -> None:
    from tests.contracts.test_container_commands import ROOT

    table = [line for line in (ROOT / "docs/serving.md").read_text().splitlines() if line.startswith("| ")]
    for name, envvars in ENVVARS.items():
        for option, envvar in envvars.items():
            flag = "--" + option.replace("_", "-")
            assert any(f"`{envvar}`" in row and f"`{flag}`" in row and name in row for row in table), envvar


# per option with an env var: (the env var's value, a flag's value, what the server gets from each)
SAMPLES: dict[str, dict[str, tuple[str, str, Any, Any]]] = {
    "replica": {
        "model_uri": ("models:/env@c", "models:/flag@c", "models:/env@c", "models:/flag@c"),
        "port": ("7001", "7002", 7001, 7002), "host": ("0.0.0.0", "127.0.0.2", "0.0.0.0", "127.0.0.2"),
        "threads": ("3", "2", 3, 2), "max_batch_size": ("8", "16", 8, 16),
        "max_batch_wait_ms": ("0.5", "4", 0.5, 4.0),
        "tracker_url": ("http://env:1", "http://flag:1", "http://env:1", "http://flag:1"),
        "service": ("envsvc", "flagsvc", "envsvc", "flagsvc"), "head_timeout_s": ("3", "4", 3.0, 4.0),
        "spool_dir": ("/tmp/env-spool", "/tmp/flag-spool", "/tmp/env-spool", "/tmp/flag-spool"),
        "log_level": ("DEBUG", "WARNING", "DEBUG", "WARNING"),
    },
    "gateway": {
        "port": ("7001", "7002", 7001, 7002), "host": ("0.0.0.0", "127.0.0.2", "0.0.0.0", "127.0.0.2"),
        "service": ("envsvc", "flagsvc", "envsvc", "flagsvc"),
        "replica": ("http://e:1, http://e:2", "http://f:1", ("http://e:1", "http://e:2"), ("http://f:1",)),
        "backup": ("http://eb:1", "http://fb:1", "http://eb:1", "http://fb:1"),
        "head_timeout_s": ("3", "4", 3.0, 4.0), "front": ("asgi", "fast", "asgi", "fast"),
        "upstream_discovery": ("dns", "static", "dns", "static"),
        "log_level": ("DEBUG", "WARNING", "DEBUG", "WARNING"),
    },
}
# where the server gets each option: its config's field (else what run_server was called with)
CONFIG_FIELD = {"replicas": "replica", "discovery": "upstream_discovery"}


def _served(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run `scanflow serve <name> argv` through the real serve path up to the server: the config its
    app is made from and the arguments run_server gets, with no server started."""
    module = MODULES[name][1]
    seen: dict[str, Any] = {}
    make_app = module.create_app

    def create_app(config: Any) -> Any:
        seen.update({CONFIG_FIELD.get(f.name, f.name): getattr(config, f.name) for f in dataclasses.fields(config)})
        return make_app(config) if name == "gateway" else None  # the fast front needs the gateway's app

    def run_server(_app: Any, host: str, port: int, log_level: str, **kw: Any) -> None:
        seen.update(host=host, port=port, log_level=log_level, front="fast" if "http" in kw else "asgi", **kw)

    monkeypatch.setattr(module, "create_app", create_app)
    monkeypatch.setattr(module, "run_server", run_server)
    result = CliRunner().invoke(app, ["serve", name, *argv])
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize("name", sorted(MODULES))
def test_an_env_var_and_a_flag_both_reach_the_servers_config(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    samples = SAMPLES[name]
    assert set(samples) == set(ENVVARS[name])
    required = {"replica": ["--model-uri", "models:/m@c", "--port", "1"], "gateway": ["--port", "1"]}[name]
    base = {"SCANFLOW_TRACKER_URL": "http://t:1"} if name == "replica" else {}  # a spool needs a Tracker
    for option, (env_value, flag_value, from_env, from_flag) in samples.items():
        flag = _options(_serve_command(name))[option].opts[0]
        use_env(monkeypatch, {**base, ENVVARS[name][option]: env_value})
        argv = list(required)
        if flag in argv:  # the env var stands in for the required flag
            del argv[argv.index(flag):argv.index(flag) + 2]
        assert _served(name, argv, monkeypatch)[option] == from_env, (option, "env")
        assert _served(name, [*argv, flag, flag_value], monkeypatch)[option] == from_flag, (option, "flag")


def test_the_options_module_stays_light_and_its_head_deadline_is_the_servers() -> None:
    from scanflow import httpdeadline
    from scanflow.serving import cliargs

    assert cliargs.DEFAULT_HEAD_TIMEOUT_S == httpdeadline.DEFAULT_HEAD_TIMEOUT_S
    code = ("import sys, scanflow.serving.cli; "
            "print(sorted(m for m in ('uvicorn', 'fastapi', 'mlflow', 'torch', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"`scanflow --help` would import {out.strip()}"


def test_the_env_thread_count_is_a_starting_size_and_the_flag_a_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--model-uri", "m", "--port", "1"]
    use_env(monkeypatch, {"SCANFLOW_THREADS": "3"})
    assert _served("replica", argv, monkeypatch)["threads_pinned"] is False
    assert _served("replica", [*argv, "--threads", "2"], monkeypatch)["threads_pinned"] is True


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_platforms_command_lines_mean_the_same_through_the_cli(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    parse = MODULES[name][1].parse_args
    platforms = _platform_command_lines()[name]
    assert platforms, f"no {name} command line found in deploy/base or the Executor's manifests"
    lines = COMMAND_LINES[name] + platforms
    use_env(monkeypatch, {"SCANFLOW_HOST": "0.0.0.0", "SCANFLOW_UPSTREAM": "http://up:8080",
                          "SCANFLOW_MODEL_URI": "models:/m@c"})
    for argv in lines:
        assert _through_the_cli(name, argv) == parse(argv), argv
    covered = {a.split("=")[0] for argv in lines for a in argv if a.startswith("--")}
    assert covered == {p.opts[0] for p in _options(_serve_command(name)).values()}


def test_bad_values_exit_2_with_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    runner = CliRunner()
    use_env(monkeypatch, {})
    bad = runner.invoke(app, ["serve", "gateway", "--port", "1", "--front", "turbo"])
    assert bad.exit_code == 2 and "'turbo' is not one of 'fast', 'asgi'" in bad.output
    assert runner.invoke(app, ["serve", "replica", "--port", "x"]).exit_code == 2
    # the cross-field checks, named after the command that ran
    missing = runner.invoke(app, ["serve", "replica", "--port", "1"], prog_name="scanflow")
    assert missing.exit_code == 2 and "--model-uri (or SCANFLOW_MODEL_URI) is required" in missing.output
    assert "Usage: scanflow serve replica" in missing.output
    threads = runner.invoke(app, ["serve", "replica", "--model-uri", "m", "--port", "1", "--threads", "0"])
    assert threads.exit_code == 2 and "--threads / SCANFLOW_THREADS must be >= 1" in threads.output
    interval = runner.invoke(app, ["serve", "gateway", "--port", "1", "--health-interval-s", "0"])
    assert interval.exit_code == 2 and "--health-interval-s" in interval.output
    # python -m: the same command, named as the platforms start it
    with pytest.raises(SystemExit) as exc:
        gateway.main(["--port", "1", "--upstream-discovery", "dns", "--front", "turbo"])
    assert exc.value.code == 2 and "Usage: python -m scanflow.serving.gateway" in capsys.readouterr().err
    use_env(monkeypatch, {"SCANFLOW_PORT": "abc"})
    with pytest.raises(SystemExit) as exc:
        replica.main(["--model-uri", "m"])
    assert exc.value.code == 2 and "(env var: 'SCANFLOW_PORT')" in capsys.readouterr().err
    assert "SCANFLOW_PORT" in serve_envvars()


def test_scanflow_serve_gateway_runs_the_gateway(tmp_path: Any) -> None:
    """The real process: `scanflow serve gateway` answers /health and reports the flags it was given."""
    port = free_port()
    argv = [sys.executable, "-m", "scanflow.cli", "serve", "gateway", "--port", str(port), "--service", "cli-test",
            "--replica", "http://127.0.0.1:9", "--allow-anonymous", "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120  # start-up is ~2 s here; a loaded CI machine may take much longer
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else proc.returncode
            try:
                state = httpx.get(f"http://127.0.0.1:{port}/admin/state", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the gateway never answered"
                time.sleep(0.1)
        assert [r["url"] for r in state["replicas"]] == ["http://127.0.0.1:9"]
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
