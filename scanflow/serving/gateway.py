"""The gateway's command line: `python -m scanflow.serving.gateway`.

Launched as `python -m scanflow.serving.gateway --port P --service NAME [--replica URL ...]
[--backup URL] [--health-interval-s 0.5] [--allow-anonymous]` (SCANFLOW_TOKEN guards /admin;
SCANFLOW_HOST, SCANFLOW_UPSTREAM, ... are defaults for the flags, see `parse_args`). With
`--upstream-discovery dns` the replica URLs are names resolved to replicas (scanflow.serving.discovery).
The server it runs (balancing, retries, failover, coalescing) is scanflow.serving.gateway_server,
behind the fast front (scanflow.serving.fastfront) unless `--front asgi`.
Who uses it: the platforms (local processes, Kubernetes), the Executor agent (admin API).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S
from scanflow.serving.cliargs import GATEWAY_PROG, env_value, gateway_parser, url_list
from scanflow.serving.gateway_server import GatewayConfig, create_app
from scanflow.serving.routing import normalize_url
from scanflow.serving.server import run_server


def parse_args(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
               prog: str = GATEWAY_PROG) -> argparse.Namespace:
    """Flags, with env defaults (flags win): SCANFLOW_PORT, SCANFLOW_HOST, SCANFLOW_SERVICE,
    SCANFLOW_UPSTREAM (replica URLs, comma-separated; used when no --replica is given),
    SCANFLOW_BACKUP, SCANFLOW_UPSTREAM_DISCOVERY, SCANFLOW_LOG_LEVEL. `prog` names the command in errors."""
    env = os.environ if env is None else env
    p = gateway_parser(prog)
    args = p.parse_args(argv)
    if args.port is None:
        args.port = env_value(p, env, "SCANFLOW_PORT", int)
    if args.port is None:
        p.error("--port (or SCANFLOW_PORT) is required")
    args.host = args.host or env.get("SCANFLOW_HOST", "").strip() or "127.0.0.1"
    args.service = args.service or env.get("SCANFLOW_SERVICE", "").strip() or "default"
    if not args.replica:
        args.replica = url_list(env.get("SCANFLOW_UPSTREAM", ""))
    args.backup = args.backup or env.get("SCANFLOW_BACKUP", "").strip() or None
    args.log_level = args.log_level or env.get("SCANFLOW_LOG_LEVEL", "").strip() or "INFO"
    args.front = args.front or env.get("SCANFLOW_GATEWAY_FRONT", "").strip() or "fast"
    if args.front not in ("fast", "asgi"):
        p.error(f"SCANFLOW_GATEWAY_FRONT={args.front!r}: use fast or asgi")
    args.upstream_discovery = (args.upstream_discovery or env.get("SCANFLOW_UPSTREAM_DISCOVERY", "").strip()
                               or "static")
    if args.upstream_discovery not in ("static", "dns"):
        p.error(f"SCANFLOW_UPSTREAM_DISCOVERY={args.upstream_discovery!r}: use static or dns")
    if args.head_timeout_s is None:
        head = env_value(p, env, "SCANFLOW_HEAD_TIMEOUT_S", float)
        args.head_timeout_s = DEFAULT_HEAD_TIMEOUT_S if head is None else head
    return args


def main(argv: list[str] | None = None, prog: str = GATEWAY_PROG) -> None:
    """Parse the flags and serve until stopped. Who calls: `python -m` (the platforms' command lines)
    and `scanflow serve gateway` (with its own `prog`)."""
    from scanflow.settings import Settings

    args = parse_args(argv, prog=prog)
    if args.health_interval_s <= 0 or args.body_timeout_s <= 0 or args.head_timeout_s <= 0:
        raise SystemExit("--health-interval-s, --body-timeout-s and --head-timeout-s must be > 0")
    try:
        config = GatewayConfig(
            service=args.service,
            replicas=tuple(normalize_url(u) for u in args.replica),
            backup=normalize_url(args.backup) if args.backup else None,
            health_interval_s=args.health_interval_s,
            token=Settings().token,
            allow_anonymous=args.allow_anonymous,
            max_body_bytes=args.max_body_bytes,
            body_timeout_s=args.body_timeout_s,
            upstream_timeout_s=args.upstream_timeout_s,
            coalesce_max=args.coalesce_max,
            batches_per_replica=max(1, args.batches_per_replica),
            discovery=args.upstream_discovery,
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    app = create_app(config)
    if args.front == "fast":
        from scanflow.serving.fastfront import protocol_for

        run_server(app, args.host, args.port, args.log_level, http=protocol_for(app.gateway),
                   head_timeout_s=args.head_timeout_s)
    else:
        run_server(app, args.host, args.port, args.log_level, head_timeout_s=args.head_timeout_s)


if __name__ == "__main__":
    main()
