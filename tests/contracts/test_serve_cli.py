"""`scanflow serve replica|gateway` are typer commands made from the modules' own flag definitions
(scanflow.serving.cliargs): every flag with its name, type, default and choices, and any command line
the platforms give `python -m scanflow.serving.replica|gateway` means the same through the CLI."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from scanflow.cli import app
from scanflow.platform import manifests as mf
from scanflow.platform.processes import free_port
from scanflow.serving import cli as serve_cli
from scanflow.serving import cliargs, gateway, replica
from scanflow.spec import load_workflow
from tests.contracts.test_container_commands import WORKFLOW, _base_docs, _containers

PARSERS: dict[str, tuple[Callable[[], argparse.ArgumentParser], Any]] = {
    "replica": (cliargs.replica_parser, replica), "gateway": (cliargs.gateway_parser, gateway)}

# the command lines the platforms build (scanflow/platform/local.py, manifests.py, deploy/base), in both
# spellings argparse accepts, and the flags no platform passes
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


def _through_the_cli(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str]:
    """Run `scanflow serve <name> argv` up to the module's main(), which records what it was given."""
    got: list[tuple[list[str], str]] = []
    module = PARSERS[name][1]
    monkeypatch.setattr(module, "main", lambda a, prog: got.append((a, prog)))
    result = CliRunner().invoke(app, ["serve", name, *argv])
    assert result.exit_code == 0, result.output
    (call,) = got
    return call


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_flag_is_a_typer_option_with_its_default(name: str) -> None:
    command: Any = typer.main.get_command(app).commands["serve"].commands[name]  # type: ignore[attr-defined]
    options = {p.opts[0]: p for p in command.params}
    parser = PARSERS[name][0]()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        opt = options.pop(action.option_strings[0])
        default = opt.default if opt.default is not None else ([] if action.default == [] else None)
        assert default == action.default, action.dest
    assert not options, f"options the module's parser does not have: {sorted(options)}"
    help_text = CliRunner().invoke(app, ["serve", name, "--help"]).output
    for action in parser._actions:
        assert action.option_strings[-1] in help_text
        if action.choices:  # typer lists the choices
            assert f"<{'|'.join(action.choices)}>" in help_text, action.dest


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_the_platforms_command_lines_mean_the_same_through_the_cli(name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    parse = PARSERS[name][1].parse_args
    platforms = _platform_command_lines()[name]
    assert platforms, f"no {name} command line found in deploy/base or the Executor's manifests"
    lines = COMMAND_LINES[name] + platforms
    env = {"SCANFLOW_HOST": "0.0.0.0", "SCANFLOW_UPSTREAM": "http://up:8080", "SCANFLOW_MODEL_URI": "models:/m@c"}
    for argv in lines:
        passed, prog = _through_the_cli(name, argv, monkeypatch)
        assert prog == f"scanflow serve {name}"
        assert vars(parse(passed, env)) == vars(parse(argv, env)), argv
    covered = {a.split("=")[0] for argv in lines for a in argv if a.startswith("--")}
    assert covered == {a.option_strings[0] for a in PARSERS[name][0]()._actions if a.dest != "help"}


def test_bad_values_are_refused_by_typer_and_env_checks_still_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["serve", "gateway", "--port", "1", "--front", "turbo"])
    assert bad.exit_code == 2 and "'turbo' is not one of 'fast', 'asgi'" in bad.output
    assert runner.invoke(app, ["serve", "replica", "--port", "x"]).exit_code == 2
    # the module's own checks (env defaults, ranges) run in its parse_args, named after the CLI command
    monkeypatch.delenv("SCANFLOW_MODEL_URI", raising=False)
    missing = runner.invoke(app, ["serve", "replica", "--port", "1"])
    assert missing.exit_code == 2 and "scanflow serve replica: error: --model-uri" in missing.output
    threads = runner.invoke(app, ["serve", "replica", "--model-uri", "m", "--port", "1", "--threads", "0"])
    assert threads.exit_code == 2 and "--threads / SCANFLOW_THREADS must be >= 1" in threads.output


def test_an_unhandled_argparse_form_is_refused_not_dropped() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--verbose", action="count")
    with pytest.raises(TypeError, match="verbose"):
        serve_cli.flags_of(p)
    p = argparse.ArgumentParser()
    p.add_argument("path")
    with pytest.raises(TypeError, match="path"):
        serve_cli.flags_of(p)


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
