"""The replica's options, declared once: `python -m scanflow.serving.replica` and `scanflow serve replica`.

Each option is a typer option; those that containers set by env name their variable with `envvar=`
(a flag on the command line wins, an unset or blank variable means "not given", `--help` lists it).
Containers (deploy/base, docker-compose.yml, `scanflow.platform.manifests`) configure replicas partly by
env (`SCANFLOW_HOST=0.0.0.0`, `SCANFLOW_THREADS`, ...), so these names are a contract with them
(tests/contracts/test_container_commands.py). The cross-field checks `ReplicaArgs` needs are in `checked`;
bad input exits 2 with click's usage error either way.

Who calls: scanflow.serving.replica (`python -m`), scanflow.serving.cli (`scanflow serve replica`).
Imports nothing heavy and never the server: whoever runs the command hands the server's `serve` in as
`ctx.obj` (cliargs.server_of), so the server imports this module and not the reverse.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated

import typer

from scanflow.serving.cliargs import (
    DEFAULT_HEAD_TIMEOUT_S,
    env_stripped,
    from_command_line,
    parse_with,
    server_of,
    standalone_app,
)
from scanflow.tracking.record_ids import SERVICE_RECORD_KEY_ENV, RecordKeyError, parse_key

__all__ = ["REPLICA_PROG", "ReplicaArgs", "app", "command", "parse_args"]

REPLICA_PROG = "python -m scanflow.serving.replica"


@dataclass(frozen=True)
class ReplicaArgs:
    """The replica's checked arguments: what `scanflow.serving.replica.serve` runs with."""

    model_uri: str
    port: int
    host: str
    threads: int | None
    threads_pinned: bool  # --threads given: the pool stays at it (SCANFLOW_THREADS is a starting size)
    max_batch_size: int
    max_batch_wait_ms: float
    tracker_url: str | None
    service: str
    replica_id: str | None
    allow_anonymous: bool
    max_body_bytes: int
    body_timeout_s: float
    head_timeout_s: float
    spool_dir: str | None  # None: records kept in memory only (or no Tracker to send them to)
    spool_max_mb: float
    spool_fsync_s: float
    allow_local_models: bool
    cpu_watch_s: float
    log_level: str
    record_key: bytes | None  # the service's record key (env only: a secret never on a command line)


def command(
    ctx: typer.Context,
    model_uri: Annotated[str | None, typer.Option(
        "--model-uri", envvar="SCANFLOW_MODEL_URI",
        help="models:/name@alias, runs:/... (required: the flag or the env var)")] = None,
    port: Annotated[int | None, typer.Option(
        "--port", envvar="SCANFLOW_PORT", help="required (the flag or the env var)")] = None,
    host: Annotated[str, typer.Option("--host", envvar="SCANFLOW_HOST")] = "127.0.0.1",
    threads: Annotated[int | None, typer.Option(
        "--threads", envvar="SCANFLOW_THREADS",
        help="pin the torch thread pool (the env var only sets its starting size, which then follows the "
             "CPU limit)")] = None,
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", envvar="SCANFLOW_MAX_BATCH_SIZE")] = 32,
    max_batch_wait_ms: Annotated[float, typer.Option(
        "--max-batch-wait-ms", envvar="SCANFLOW_MAX_BATCH_WAIT_MS")] = 2.0,
    tracker_url: Annotated[str | None, typer.Option("--tracker-url", envvar="SCANFLOW_TRACKER_URL")] = None,
    service: Annotated[str, typer.Option("--service", envvar="SCANFLOW_SERVICE")] = "default",
    replica_id: Annotated[str | None, typer.Option("--replica-id")] = None,
    allow_anonymous: Annotated[bool, typer.Option("--allow-anonymous")] = False,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes")] = 1 << 20,
    body_timeout_s: Annotated[float, typer.Option(
        "--body-timeout-s",
        help="a request body must arrive in full within this (else 408 and the connection closes)")] = 10.0,
    head_timeout_s: Annotated[float, typer.Option(
        "--head-timeout-s", envvar="SCANFLOW_HEAD_TIMEOUT_S",
        help="a request line and headers must arrive in full within this (else 408 and the connection "
             "closes)")] = DEFAULT_HEAD_TIMEOUT_S,
    spool_dir: Annotated[str | None, typer.Option(
        "--spool-dir", envvar="SCANFLOW_SPOOL_DIR",
        help="durable record spool (with --tracker-url; default ./scanflow-spool/<replica-id or "
             "service-port>; 'none': memory only)")] = None,
    spool_max_mb: Annotated[float, typer.Option(
        "--spool-max-mb", help="spool bound; newer records refused over it")] = 256.0,
    spool_fsync_s: Annotated[float, typer.Option("--spool-fsync-s", help="how often the spool is fsynced")] = 1.0,
    allow_local_models: Annotated[bool, typer.Option(
        "--allow-local-models",
        help="POST /admin/model may load file:// URIs and paths (else models:/ and runs:/ only)")] = False,
    cpu_watch_s: Annotated[float, typer.Option(
        "--cpu-watch-s",
        help="how often to re-read the cgroup CPU limit and resize the thread pool (0: never)")] = 5.0,
    log_level: Annotated[str, typer.Option("--log-level", envvar="SCANFLOW_LOG_LEVEL")] = "INFO",
) -> None:
    """The inference replica: one process serving one model over HTTP."""
    # the values are read from ctx.params, where click also says where each came from (flag or env)
    server_of(ctx)(checked(ctx))


def checked(ctx: typer.Context) -> ReplicaArgs:
    """The parsed options as ReplicaArgs, after the checks one option alone cannot make; a failed check
    is a usage error (exit 2) naming the flag and its env var."""
    v = env_stripped(ctx)
    if not v["model_uri"]:
        ctx.fail("--model-uri (or SCANFLOW_MODEL_URI) is required")
    if v["port"] is None:
        ctx.fail("--port (or SCANFLOW_PORT) is required")
    if v["threads"] is not None and v["threads"] < 1:
        ctx.fail("--threads / SCANFLOW_THREADS must be >= 1")
    if v["max_batch_size"] < 1 or v["max_batch_wait_ms"] < 0 or v["cpu_watch_s"] < 0:
        ctx.fail("--max-batch-size must be >= 1, --max-batch-wait-ms and --cpu-watch-s >= 0")
    if min(v["body_timeout_s"], v["head_timeout_s"], v["spool_max_mb"], v["spool_fsync_s"]) <= 0:
        ctx.fail("--body-timeout-s, --head-timeout-s, --spool-max-mb and --spool-fsync-s must be > 0")
    spool = v["spool_dir"]
    if spool is None:  # stable across restarts of the same replica: its id, else its service and port
        spool = os.path.join("scanflow-spool", v["replica_id"] or f"{v['service']}-{v['port']}")
    v["spool_dir"] = None if spool.lower() == "none" or not v["tracker_url"] else spool
    key = os.environ.get(SERVICE_RECORD_KEY_ENV, "").strip()
    try:
        record_key = parse_key(key, SERVICE_RECORD_KEY_ENV) if key else None
    except RecordKeyError as exc:
        ctx.fail(str(exc))
    return ReplicaArgs(**v, threads_pinned=from_command_line(ctx, "threads"), record_key=record_key)


app = standalone_app(command)


def parse_args(argv: list[str] | None = None, prog: str = REPLICA_PROG) -> ReplicaArgs:
    """The checked arguments of `python -m scanflow.serving.replica ARGV` (env vars as defaults, from
    os.environ), without serving; bad input prints the usage error and exits 2."""
    args: ReplicaArgs = parse_with(app, argv, prog)
    return args
