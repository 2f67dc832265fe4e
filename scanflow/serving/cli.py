"""`scanflow serve replica|gateway`: the same processes as `python -m scanflow.serving.replica|gateway`.

Each sub-command is the very typer command the module runs under `python -m`
(scanflow.serving.replica_args, scanflow.serving.gateway_args: options declared once, env vars by
`envvar=`), so the platforms' command lines and the CLI take the same flags, env vars, defaults and
checks, and `--help` looks like the rest of the CLI.

Who calls: scanflow.cli (the `serve` group). The servers' heavy imports happen inside the commands.
"""

from __future__ import annotations

import typer

from scanflow.serving import gateway_args, replica_args

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


def _serve_replica(args: replica_args.ReplicaArgs) -> None:
    from scanflow.serving.replica import serve  # torch, mlflow: only when serving, never for --help

    serve(args)


def _serve_gateway(args: gateway_args.GatewayArgs) -> None:
    from scanflow.serving.gateway import serve  # uvicorn, aiohttp: only when serving

    serve(args)


SERVERS = {"replica": _serve_replica, "gateway": _serve_gateway}


@app.callback()
def _hand_over_the_server(ctx: typer.Context) -> None:
    """The sub-command's server, as its ctx.obj (cliargs.server_of); a caller's own callable wins
    (tests parse without serving)."""
    if not callable(ctx.obj) and ctx.invoked_subcommand in SERVERS:
        ctx.obj = SERVERS[ctx.invoked_subcommand]


app.command("replica")(replica_args.command)
app.command("gateway")(gateway_args.command)
