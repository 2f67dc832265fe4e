"""What the replica's and the gateway's command lines share: how one typer command is run, parsed
without serving, and how env values are cleaned.

Each server declares its options once, as typer options with `envvar=` (scanflow.serving.replica_args,
scanflow.serving.gateway_args): `python -m scanflow.serving.replica|gateway` run that command as a
one-command app, and `scanflow serve replica|gateway` (scanflow.serving.cli) register the same function,
so the platforms' command lines and the CLI cannot drift apart, and `--help` shows each env var.
This module imports nothing heavy: the CLI builds its command tree from these modules on every
`scanflow` call.

Who calls: scanflow.serving.replica_args, scanflow.serving.gateway_args.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import typer

# the servers' deadline on a request head, as scanflow.httpdeadline.DEFAULT_HEAD_TIMEOUT_S: that module
# imports uvicorn, too heavy for `scanflow --help` (tests/contracts/test_serve_cli.py pins them equal)
DEFAULT_HEAD_TIMEOUT_S = 10.0

# -h as well as --help, as argparse had it for `python -m` and as `scanflow` has it
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


def standalone_app(command: Callable[..., None]) -> typer.Typer:
    """A typer app whose only command is `command`: typer runs it without a sub-command name, so
    `python -m MODULE --port 1` works as the platforms write it."""
    app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings=HELP_OPTIONS)
    app.command()(command)
    return app


def server_of(ctx: typer.Context) -> Callable[[Any], None]:
    """What a server command does with its checked arguments: `ctx.obj`, the callable its caller passed.
    The server module passes its `serve` (`python -m`), scanflow.serving.cli a lazy import of it, and
    `parse_with` a collector (parsing without serving). The argument modules never import the servers:
    the servers import them, so the reverse would be an import cycle."""
    if not callable(ctx.obj):
        raise TypeError(f"{ctx.info_name}: run without a server to hand the arguments to (ctx.obj)")
    serve: Callable[[Any], None] = ctx.obj
    return serve


def parse_with(app: typer.Typer, argv: list[str] | None, prog: str) -> Any:
    """The checked arguments `app`'s command would serve with, without serving.

    Bad input behaves as when serving: click prints the usage error and this exits 2 (`--help`
    prints the help and exits 0), so callers see what `python -m` would show."""
    got: list[Any] = []
    try:
        app(args=argv, prog_name=prog, obj=got.append)
    except SystemExit as exc:  # click's standalone mode ends every run with sys.exit
        if exc.code or not got:
            raise
    return got[0]


def env_stripped(ctx: typer.Context) -> dict[str, Any]:
    """`ctx.params`, with the strings that came from env vars stripped, and blank ones replaced by the
    option's default: manifests may carry stray spaces, and a blank variable means "not given"."""
    defaults: Mapping[str, Any] = {p.name: p.default for p in ctx.command.params if p.name}
    out = dict(ctx.params)
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)
        if isinstance(value, str) and source is not None and source.name == "ENVIRONMENT":
            out[name] = value.strip() or defaults.get(name)
    return out


def from_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was given as a flag (not taken from its env var or default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def url_list(text: str) -> list[str]:
    """'http://a:1, http://b:2' -> ['http://a:1', 'http://b:2'] (SCANFLOW_UPSTREAM may list several)."""
    return [u.strip() for u in text.replace(";", ",").split(",") if u.strip()]
