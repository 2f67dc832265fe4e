"""Sub-commands of this area (filled in by its owner). Keep heavy imports inside the commands."""

import typer

app = typer.Typer(no_args_is_help=True)
