"""`scanflow agent ...`: serve agents declared in a Python file or module. Heavy imports stay inside commands."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@app.command("run")
def run(
    file: Annotated[
        str, typer.Argument(help="Python file defining one or more scanflow.agent.Agent objects, or a module "
                            "reference such as scanflow.standard.planner:agent")
    ],
    name: Annotated[
        str | None, typer.Option("--name", help="which agent, when the file defines several")
    ] = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8080,
    host: Annotated[str | None, typer.Option("--host", help="default: SCANFLOW_HOST or 127.0.0.1")] = None,
    peer: Annotated[
        list[str] | None,
        typer.Option("--peer", help="another agent: NAME=http://HOST:PORT (repeatable); adds to / overrides "
                     "SCANFLOW_PEERS"),
    ] = None,
    allow_anonymous: Annotated[
        bool,
        typer.Option("--allow-anonymous", help="accept mutating calls without a token (one laptop, tests)"),
    ] = False,
    workflow: Annotated[
        str | None,
        typer.Option("--workflow", envvar="SCANFLOW_WORKFLOW",
                     help="the workflow file (.py, .yaml) the agent serves in: its name, settings and strategies "
                     "come from the workflow's agent of that name (or role)"),
    ] = None,
) -> None:
    """Serve one agent from FILE (or MODULE:ATTR) on HOST:PORT (token from SCANFLOW_TOKEN; store in SCANFLOW_HOME; peers from
    SCANFLOW_PEERS and --peer; workflow from SCANFLOW_WORKFLOW or --workflow)."""
    from scanflow.agent.agent import AgentDefinitionError
    from scanflow.agent.serve import load_agents, parse_peers, serve
    from scanflow.settings import Settings
    from scanflow.spec import SpecError, load_workflow

    try:
        agents = load_agents(file)
        peers = parse_peers(peer or [])
    except (AgentDefinitionError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if name is None:
        if len(agents) > 1:
            typer.echo(
                f"error: {file} defines several agents {sorted(agents)}; pick one with --name", err=True
            )
            raise typer.Exit(2)
        agent = next(iter(agents.values()))
    elif name in agents:
        agent = agents[name]
    else:
        typer.echo(f"error: no agent {name!r} in {file} (found {sorted(agents)})", err=True)
        raise typer.Exit(2)
    try:
        if workflow:
            agent = agent.bound(load_workflow(workflow))
        agent.check()
    except (AgentDefinitionError, SpecError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        settings = Settings()
    except (ValueError, FileNotFoundError) as exc:  # a bad SCANFLOW_PEERS / SCANFLOW_CONFIG names itself
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    peers = settings.peer_urls(peers, own_name=agent.name)
    serve(agent, settings, host=host, port=port, peers=peers, allow_anonymous=allow_anonymous)
