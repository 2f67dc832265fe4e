"""The gateway's command line: `python -m scanflow.serving.gateway`.

Launched as `python -m scanflow.serving.gateway --port P --service NAME [--replica URL ...]
[--backup URL] [--health-interval-s 0.5] [--allow-anonymous]` (SCANFLOW_TOKEN guards /admin;
SCANFLOW_HOST, SCANFLOW_UPSTREAM, ... are defaults for the flags: the options are declared once, in
scanflow.serving.gateway_args, with `scanflow serve gateway`). With
`--upstream-discovery dns` the replica URLs are names resolved to replicas (scanflow.serving.discovery).
The server it runs (balancing, retries, failover, coalescing) is scanflow.serving.gateway_server,
behind the fast front (scanflow.serving.fastfront) unless `--front asgi`.
Who uses it: the platforms (local processes, Kubernetes), the Executor agent (admin API).
"""

from __future__ import annotations

from pydantic import SecretStr

from scanflow.serving.gateway_args import GATEWAY_PROG, GatewayArgs, app, parse_args
from scanflow.serving.gateway_server import GatewayConfig, create_app
from scanflow.serving.routing import normalize_url
from scanflow.serving.server import run_server

__all__ = ["config_of", "main", "parse_args", "serve"]


def config_of(args: GatewayArgs, token: SecretStr | None) -> GatewayConfig:
    """The server's config from the checked arguments; a URL or setting the config refuses raises
    ValueError."""
    return GatewayConfig(
        service=args.service,
        replicas=tuple(normalize_url(u) for u in args.replica),
        backup=normalize_url(args.backup) if args.backup else None,
        health_interval_s=args.health_interval_s,
        token=token,
        allow_anonymous=args.allow_anonymous,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        upstream_timeout_s=args.upstream_timeout_s,
        coalesce_max=args.coalesce_max,
        batches_per_replica=max(1, args.batches_per_replica),
        discovery=args.upstream_discovery,
    )


def serve(args: GatewayArgs) -> None:
    """Serve until stopped, behind the fast front unless `--front asgi`. Who calls: the gateway command
    (scanflow.serving.gateway_args), under `python -m` and `scanflow serve gateway` alike."""
    from scanflow.settings import Settings

    try:
        config = config_of(args, Settings().token)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    app = create_app(config)
    if args.front == "fast":
        from scanflow.serving.fastfront import protocol_for

        run_server(app, args.host, args.port, args.log_level, http=protocol_for(app.gateway),
                   head_timeout_s=args.head_timeout_s)
    else:
        run_server(app, args.host, args.port, args.log_level, head_timeout_s=args.head_timeout_s)


def main(argv: list[str] | None = None, prog: str = GATEWAY_PROG) -> None:
    """`python -m scanflow.serving.gateway`: parse the flags (env vars as defaults) and serve; bad input
    exits 2 with a usage error."""
    app(args=argv, prog_name=prog, obj=serve)


if __name__ == "__main__":
    main()
