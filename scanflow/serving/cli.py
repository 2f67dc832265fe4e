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
app.command("replica")(replica_args.command)
app.command("gateway")(gateway_args.command)
