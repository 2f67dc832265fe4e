"""`scanflow mlflow ...`: run the embedded MLflow tracking server, or the authenticating proxy in front
of any MLflow server (compose, Kubernetes). Heavy imports stay inside commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@app.command("up")
def up(
    home: Annotated[Path, typer.Option(help="state directory: mlflow.db, artifacts/, log")] = Path(
        ".scanflow/mlflow"
    ),
    port: Annotated[int, typer.Option(help="TCP port (0: pick a free one)")] = 5000,
    host: Annotated[str, typer.Option(help="interface to bind (0.0.0.0 in containers)")] = "127.0.0.1",
    allow_host: Annotated[
        list[str] | None,
        typer.Option("--allow-host", help="extra Host header names clients use (compose/Kubernetes names)"),
    ] = None,
) -> None:
    """Run an MLflow server (SQLite + proxied artifacts) in the foreground until Ctrl-C / SIGTERM,
    behind logins: MLflow listens on a private Unix socket and the authenticating proxy on the port.
    The logins are in <home>/logins.json (mode 0600; made on the first run, kept for the next)."""
    import signal
    import threading

    from scanflow.tracking.logins import LoginsFileError, load_or_create, logins_path
    from scanflow.tracking.server import MlflowServer, _write_state

    try:
        logins = load_or_create(home)
    except LoginsFileError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    server = MlflowServer(home, port=port or None, host=host, extra_allowed_hosts=allow_host or (), users=logins)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        _write_state(server.home, server)
        typer.echo(f"mlflow server ready at {server.url} (log {server.log_path})")
        typer.echo(f"logins: {logins_path(server.home)} (mode 0600; user 'operator' administers, 'agent' "
                   "writes, 'job' may not move champion, 'replica' reads); clients send "
                   "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")
        try:
            while not stop.wait(1.0):
                if not server.alive():
                    typer.echo("mlflow server (or its proxy) exited; see its log", err=True)
                    raise typer.Exit(1)
        except KeyboardInterrupt:
            pass
    typer.echo("mlflow server stopped")


@app.command("proxy")
def proxy(
    port: Annotated[int, typer.Option(help="TCP port clients use")] = 5000,
    host: Annotated[str, typer.Option(help="interface to bind (0.0.0.0 in containers)")] = "127.0.0.1",
    upstream: Annotated[
        str | None, typer.Option(help="MLflow's URL, on an address only the proxy reaches (e.g. http://127.0.0.1:5001)")
    ] = None,
    upstream_uds: Annotated[str | None, typer.Option(help="MLflow's Unix socket (instead of --upstream)")] = None,
) -> None:
    """Serve MLflow behind logins with roles (scanflow.tracking.mlflow_proxy). The logins (digests) come
    from SCANFLOW_MLFLOW_USERS or the file SCANFLOW_MLFLOW_USERS_FILE names, never from argv."""
    from scanflow.tracking.mlflow_proxy import serve

    if (upstream is None) == (upstream_uds is None):
        raise typer.BadParameter("give exactly one of --upstream and --upstream-uds")
    serve(host, port, upstream, upstream_uds)
