"""`scanflow ...`: the command line. Typer, for typed options and help text for free.

Each area owns its sub-commands in its own `cli.py` (agent, serving, tracking, platform, demo);
those modules import heavy libraries (torch, mlflow, kubernetes) inside the commands, so
`scanflow --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from scanflow.agent.cli import app as agent_app
from scanflow.embedded import cli as stack_cli
from scanflow.embedded import clientcli as client_cli
from scanflow.embedded import readcli as read_cli
from scanflow.platform.cli import deploy as deploy_command
from scanflow.serving.cli import app as serve_app
from scanflow.tracking.cli import app as mlflow_app

# -h as well as --help, on every command (click hands the root's help names down to sub-commands)
app = typer.Typer(no_args_is_help=True, add_completion=False, help="Scanflow: autonomic MLOps.", rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(agent_app, name="agent", help="Serve agents declared in a Python file.")
app.add_typer(serve_app, name="serve", help="Run an inference replica or a gateway.")
app.add_typer(mlflow_app, name="mlflow", help="Run the embedded MLflow tracking server.")
app.command("deploy")(deploy_command)
app.command("up")(stack_cli.up)
app.command("status")(stack_cli.status)
app.command("down")(stack_cli.down)
app.command("decisions")(read_cli.decisions)
app.command("plans")(read_cli.plans)
app.command("logs")(read_cli.logs)
app.command("traffic")(client_cli.traffic)
app.command("feedback")(client_cli.feedback)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"scanflow {version('scanflow')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("scanflow (not installed: no version)")
        raise typer.Exit(0)


@app.callback()
def _root(
    _version_flag: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False,
) -> None:
    """Scanflow: autonomic MLOps."""


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="workflow file: .py (defines `workflow`) or .yaml")],
    yaml_output: Annotated[bool, typer.Option("--yaml", help="print the workflow as YAML when valid")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print nothing when valid (the exit code says)")] = False,
) -> None:
    """Check a workflow declaration, its shape and its meaning; one summary line when valid.

    Meaning: constraints compile, actions name agents and actuators that exist, agent modules and job
    entry points import, strategies wait for events some agent produces, settings keys are read.
    One line per problem on stderr ('field.path = value: what is wrong'), exit code 2 if any.
    """
    from scanflow.validation import validate_file

    wf, problems = validate_file(file)
    if problems or wf is None:
        for problem in problems:
            typer.echo(problem.line(), err=True)
        raise typer.Exit(2)
    if yaml_output:
        typer.echo(wf.to_yaml(), nl=False)
    if not quiet:
        typer.echo(f"ok: workflow {wf.name!r}: {len(wf.jobs)} jobs, {len(wf.services)} services, "
                   f"{len(wf.agents)} agents", err=yaml_output)  # beside YAML on stdout: stderr


@app.command()
def init(
    name: Annotated[str, typer.Argument(help="package and workflow name, e.g. churn (lower case, underscores), "
                                        "or a path ending in it, e.g. models/churn")],
    directory: Annotated[Path | None, typer.Option("--dir", help="where to create NAME/ (default: .)")] = None,
) -> None:
    """Write a runnable workflow skeleton NAME/ (training job, workflow, README) to make your own."""
    from scanflow.scaffold import ScaffoldError, write

    path = Path(name)
    if len(path.parts) > 1 and directory is not None:
        typer.echo(f"error: {name!r} is a path and --dir is given: use one of them", err=True)
        raise typer.Exit(2)
    try:
        target = write(path.name, directory if directory is not None else path.parent)
    except (ScaffoldError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {target}/: data.py, train.py, workflow.py, README.md\n"
               f"next: scanflow validate {target}/workflow.py && scanflow up {target}/workflow.py")


@app.command()
def demo(
    json_output: Annotated[bool, typer.Option("--json", help="print the figures as JSON, last line")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="small sizes (as in the tests)")] = False,
    home: Annotated[Path, typer.Option(help="state directory for this run")] = Path(".scanflow/demo"),
) -> None:
    """Run the autonomic scenarios S1-S4 on the embedded default; exit 0 only if each met its bar."""
    from scanflow.demo import run_demo

    ok = run_demo(json_output=json_output, quick=quick, home=home)
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
