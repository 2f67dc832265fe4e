"""The inference replica's command line: `python -m scanflow.serving.replica`.

Launched by the platforms as
`python -m scanflow.serving.replica --model-uri URI --port P [--host H] [--threads N]
[--max-batch-size 32] [--max-batch-wait-ms 2] [--tracker-url URL] [--service NAME] [--replica-id ID]
[--allow-anonymous] [--cpu-watch-s 5]` (env MLFLOW_TRACKING_URI resolves models:/ URIs, SCANFLOW_TOKEN
guards /admin; SCANFLOW_HOST, SCANFLOW_THREADS, ... are defaults for the flags: the options are
declared once, in scanflow.serving.replica_args, with `scanflow serve replica`).
Unless `--threads` (or POST /admin/threads) pins it, the thread pool follows the cgroup CPU limit.
The server it runs (endpoints, micro-batching, hot swap) is scanflow.serving.replica_server.
"""

from __future__ import annotations

import os

from pydantic import SecretStr

from scanflow.serving.replica_args import REPLICA_PROG, ReplicaArgs, app, parse_args
from scanflow.serving.replica_server import ReplicaConfig, create_app
from scanflow.serving.server import run_server

__all__ = ["config_of", "main", "parse_args", "serve"]


def config_of(args: ReplicaArgs, token: SecretStr | None) -> ReplicaConfig:
    """The server's config from the checked arguments (pure: the replica id defaults to one with this
    process's pid, so two replicas of a service started without ids still differ)."""
    return ReplicaConfig(
        model_uri=args.model_uri,
        service=args.service,
        replica_id=args.replica_id or f"{args.service}-{os.getpid()}",
        threads=args.threads,
        threads_pinned=args.threads_pinned,
        cpu_watch_s=args.cpu_watch_s,
        max_batch_size=args.max_batch_size,
        max_batch_wait_ms=args.max_batch_wait_ms,
        tracker_url=args.tracker_url,
        token=token,
        allow_anonymous=args.allow_anonymous,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        spool_dir=args.spool_dir,
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)),
        spool_fsync_s=args.spool_fsync_s,
        allow_local_models=args.allow_local_models,
        record_key=args.record_key,
    )


def serve(args: ReplicaArgs) -> None:
    """Serve until stopped. Who calls: the replica command (scanflow.serving.replica_args), under
    `python -m` and `scanflow serve replica` alike."""
    from scanflow.settings import Settings

    run_server(create_app(config_of(args, Settings().token)), args.host, args.port, args.log_level,
               head_timeout_s=args.head_timeout_s)


def main(argv: list[str] | None = None, prog: str = REPLICA_PROG) -> None:
    """`python -m scanflow.serving.replica`: parse the flags (env vars as defaults) and serve; bad input
    exits 2 with a usage error."""
    app(args=argv, prog_name=prog, obj=serve)


if __name__ == "__main__":
    main()
