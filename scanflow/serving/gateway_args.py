"""The gateway's options, declared once: `python -m scanflow.serving.gateway` and `scanflow serve gateway`.

Each option is a typer option; those that containers set by env name their variable with `envvar=`
(a flag on the command line wins, an unset or blank variable means "not given", `--help` lists it).
deploy/base gives the gateway its replicas by `SCANFLOW_UPSTREAM` (comma-separated URLs), so these
names are a contract with the manifests (tests/contracts/test_container_commands.py). The checks one
option alone cannot make are in `checked`; bad input exits 2 with click's usage error either way.

Who calls: scanflow.serving.gateway (`python -m`), scanflow.serving.cli (`scanflow serve gateway`).
Imports nothing heavy and never the server: whoever runs the command hands the server's `serve` in as
`ctx.obj` (cliargs.server_of), so the server imports this module and not the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import typer

from scanflow.serving.cliargs import (
    DEFAULT_HEAD_TIMEOUT_S,
    env_stripped,
    from_command_line,
    parse_with,
    server_of,
    standalone_app,
    url_list,
)

__all__ = ["GATEWAY_PROG", "GatewayArgs", "app", "command", "parse_args"]

GATEWAY_PROG = "python -m scanflow.serving.gateway"


@dataclass(frozen=True)
class GatewayArgs:
    """The gateway's checked arguments: what `scanflow.serving.gateway.serve` runs with."""

    port: int
    host: str
    service: str
    replica: list[str]
    backup: str | None
    health_interval_s: float
    upstream_timeout_s: float
    max_body_bytes: int
    body_timeout_s: float
    head_timeout_s: float
    coalesce_max: int
    batches_per_replica: int
    front: Literal["fast", "asgi"]
    upstream_discovery: Literal["static", "dns"]
    allow_anonymous: bool
    log_level: str


def _replica_urls(ctx: typer.Context, value: list[str] | None) -> list[str]:
    """--replica's values; from SCANFLOW_UPSTREAM, split at commas (click splits env lists at spaces
    only), so 'http://a:1, http://b:2' and 'http://a:1,http://b:2' both name two replicas."""
    if not value:
        return []
    if from_command_line(ctx, "replica"):
        return list(value)
    return [url for item in value for url in url_list(item)]


def command(
    ctx: typer.Context,
    port: Annotated[int | None, typer.Option(
        "--port", envvar="SCANFLOW_PORT", help="required (the flag or the env var)")] = None,
    host: Annotated[str, typer.Option("--host", envvar="SCANFLOW_HOST")] = "127.0.0.1",
    service: Annotated[str, typer.Option("--service", envvar="SCANFLOW_SERVICE")] = "default",
    replica: Annotated[list[str] | None, typer.Option(
        "--replica", envvar="SCANFLOW_UPSTREAM", metavar="URL", callback=_replica_urls,
        help="replica base URL (repeatable; the env var: comma-separated, used when no --replica is given)",
    )] = None,
    backup: Annotated[str | None, typer.Option(
        "--backup", envvar="SCANFLOW_BACKUP", help="base URL taking traffic when no replica is healthy")] = None,
    health_interval_s: Annotated[float, typer.Option("--health-interval-s")] = 0.5,
    upstream_timeout_s: Annotated[float, typer.Option("--upstream-timeout-s")] = 30.0,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes")] = 4 << 20,
    body_timeout_s: Annotated[float, typer.Option(
        "--body-timeout-s",
        help="a request body must arrive in full within this (else 408 and the connection closes)")] = 10.0,
    head_timeout_s: Annotated[float, typer.Option(
        "--head-timeout-s", envvar="SCANFLOW_HEAD_TIMEOUT_S",
        help="a request line and headers must arrive in full within this (else 408 and the connection "
             "closes)")] = DEFAULT_HEAD_TIMEOUT_S,
    coalesce_max: Annotated[int, typer.Option(
        "--coalesce-max",
        help="client requests per upstream call (POST /predict_batch); 0 or 1 forwards each alone")] = 64,
    batches_per_replica: Annotated[int, typer.Option(
        "--batches-per-replica", help="coalesced calls in flight per replica")] = 1,
    front: Annotated[Literal["fast", "asgi"], typer.Option(
        "--front", envvar="SCANFLOW_GATEWAY_FRONT",
        help="fast: the common POST /predict answered from the HTTP protocol, no ASGI cycle "
             "(scanflow.serving.fastfront); asgi: every request through uvicorn's ASGI cycle")] = "fast",
    upstream_discovery: Annotated[Literal["static", "dns"], typer.Option(
        "--upstream-discovery", envvar="SCANFLOW_UPSTREAM_DISCOVERY",
        help="static: the --replica URLs are the replicas; dns: each names a set of replicas, one per "
             "address it resolves to, re-resolved every health interval (a Kubernetes headless Service)",
    )] = "static",
    allow_anonymous: Annotated[bool, typer.Option("--allow-anonymous")] = False,
    log_level: Annotated[str, typer.Option("--log-level", envvar="SCANFLOW_LOG_LEVEL")] = "INFO",
) -> None:
    """The gateway: one endpoint per service in front of its replicas."""
    # the values are read from ctx.params, where click also says where each came from (flag or env)
    server_of(ctx)(checked(ctx))


def checked(ctx: typer.Context) -> GatewayArgs:
    """The parsed options as GatewayArgs, after the checks one option alone cannot make; a failed check
    is a usage error (exit 2)."""
    v = env_stripped(ctx)
    if v["port"] is None:
        ctx.fail("--port (or SCANFLOW_PORT) is required")
    if min(v["health_interval_s"], v["body_timeout_s"], v["head_timeout_s"]) <= 0:
        ctx.fail("--health-interval-s, --body-timeout-s and --head-timeout-s must be > 0")
    return GatewayArgs(**v)


app = standalone_app(command)


def parse_args(argv: list[str] | None = None, prog: str = GATEWAY_PROG) -> GatewayArgs:
    """The checked arguments of `python -m scanflow.serving.gateway ARGV` (env vars as defaults, from
    os.environ), without serving; bad input prints the usage error and exits 2."""
    args: GatewayArgs = parse_with(app, argv, prog)
    return args
