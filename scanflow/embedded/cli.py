"""`scanflow up | status | down`: run a workflow's embedded stack from the command line, and watch it.

`up` runs in the foreground (scanflow/embedded/up.py); `status` and `down` find it through
`<home>/stack.json` (scanflow/embedded/statefile.py): the home given, or the one stack under ./.scanflow
(scanflow/embedded/findstack.py). Exit codes: 2 for bad input or no stack in the
home, one line on stderr, never a traceback; `status` 0 when everything is up, 1 when something is
down; `down` 0 once everything is gone. Heavy imports stay inside the commands.
Who calls: scanflow/cli.py registers these commands.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from scanflow.embedded.statefile import StackState

HomeOpt = Annotated[Path | None, typer.Option("--home", help="the stack's directory (default .scanflow/<workflow>)")]


def one_line(message: str) -> str:
    """Pure: a possibly multi-line message (a SpecError lists one field per line) as one line."""
    parts = [p.strip() for p in message.splitlines() if p.strip()]
    return " ".join(p if p.endswith(":") else p.rstrip(";") + ";" for p in parts).rstrip(";")


def _fail(message: str, rc: int = 2) -> typer.Exit:
    typer.echo(f"error: {one_line(message)}", err=True)
    return typer.Exit(rc)


def up(
    file: Annotated[Path, typer.Argument(help="workflow file: .py (defines `workflow`) or .yaml")],
    home: HomeOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="small sizes: short bootstrap training, small windows")] = False,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="the agents' token: reused if the file holds one, "
                                  "else created there (mode 0600); default <home>/token")
    ] = None,
) -> None:
    """Run a workflow's whole stack here (MLflow, bootstrap, agents, services) until Ctrl-C or SIGTERM."""
    from scanflow.embedded.statefile import default_home
    from scanflow.embedded.up import UpError, run_up
    from scanflow.spec import SpecError, load_workflow

    try:
        wf = load_workflow(file)
    except SpecError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - user code in a .py workflow: any error is still one line
        raise _fail(f"{file}: cannot load the workflow: {type(exc).__name__}: {exc}") from None
    if not wf.services or not wf.jobs:
        raise _fail(f"workflow {wf.name!r} needs a job (the bootstrap trains its first champion with it) "
                    "and a service to run as a stack")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        rc = run_up(wf, home or default_home(wf.name), quick=quick, token_file=token_file, echo=typer.echo)
    except UpError as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(rc)


def status(
    home: HomeOpt = None,
    workflow_name: Annotated[str | None, typer.Option("--workflow-name", help="home .scanflow/NAME")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """How a running stack is: the up process, MLflow, each agent, each service. rc 0 all up, 1 not, 2 none."""
    from scanflow.embedded.stackstatus import classify, probe, render

    state = _state_or_exit(_home(home, workflow_name))
    report = classify(probe(state))
    typer.echo(json.dumps(report.to_dict(state), indent=2) if json_output else render(report, state))
    raise typer.Exit(report.rc)


def down(
    home: HomeOpt = None,
    workflow_name: Annotated[str | None, typer.Option("--workflow-name", help="home .scanflow/NAME")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", min=0, help="seconds to wait for up to stop")] = 120.0,
) -> None:
    """Stop the stack of a home: SIGTERM to `up`, then (past --timeout) SIGKILL and a sweep. rc 0 all gone."""
    from scanflow.embedded.teardown import down as stop_stack

    target = _home(home, workflow_name)
    state = _state_or_exit(target)
    typer.echo(f"stopping the stack {state.workflow!r} in {target} (up pid {state.pid.pid}) ...")
    result = stop_stack(target, state, timeout_s)
    killed = sorted(set(result.killed)) or "nothing"
    if not result.up_was_alive:
        typer.echo(f"up (pid {state.pid.pid}) was already gone; swept what it left: killed {killed}")
    elif not result.graceful:
        typer.echo(f"up did not stop within {timeout_s:.0f}s; killed {killed}")
    if result.left:
        raise _fail(f"still alive after SIGKILL: {sorted(set(result.left))}", 1)
    typer.echo("stopped: nothing of the stack is left")


def _home(home: Path | None, workflow_name: str | None) -> Path:
    from scanflow.embedded.statefile import default_home

    if home is not None and workflow_name is not None:
        raise _fail("give --home or --workflow-name, not both")
    if home is None and workflow_name is None:
        from scanflow.embedded.findstack import NoStackHere, find_home

        try:
            return find_home()
        except NoStackHere as exc:
            raise _fail(str(exc)) from None
    return (home or default_home(str(workflow_name))).resolve()


def _state_or_exit(home: Path) -> StackState:
    from scanflow.embedded.statefile import StateError, read_state

    try:
        state = read_state(home)
    except StateError as exc:
        raise _fail(str(exc)) from None
    if state is None:
        raise _fail(f"no stack in {home} (no stack.json)")
    return state
