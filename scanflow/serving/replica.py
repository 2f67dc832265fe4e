"""The inference replica's command line: `python -m scanflow.serving.replica`.

Launched by the platforms as
`python -m scanflow.serving.replica --model-uri URI --port P [--host H] [--threads N]
[--max-batch-size 32] [--max-batch-wait-ms 2] [--tracker-url URL] [--service NAME] [--replica-id ID]
[--allow-anonymous] [--cpu-watch-s 5]` (env MLFLOW_TRACKING_URI resolves models:/ URIs, SCANFLOW_TOKEN
guards /admin; SCANFLOW_HOST, SCANFLOW_THREADS, ... are defaults for the flags, see `parse_args`).
Unless `--threads` (or POST /admin/threads) pins it, the thread pool follows the cgroup CPU limit.
The server it runs (endpoints, micro-batching, hot swap) is scanflow.serving.replica_server.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from scanflow.httpdeadline import DEFAULT_HEAD_TIMEOUT_S
from scanflow.serving.cliargs import REPLICA_PROG, env_value, replica_parser
from scanflow.serving.replica_server import ReplicaConfig, create_app
from scanflow.serving.server import run_server
from scanflow.tracking.record_ids import SERVICE_RECORD_KEY_ENV, RecordKeyError, parse_key

__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
               prog: str = REPLICA_PROG) -> argparse.Namespace:
    """Flags, with env defaults (flags win): SCANFLOW_MODEL_URI, SCANFLOW_PORT, SCANFLOW_HOST,
    SCANFLOW_THREADS, SCANFLOW_SERVICE, SCANFLOW_MAX_BATCH_SIZE, SCANFLOW_MAX_BATCH_WAIT_MS,
    SCANFLOW_TRACKER_URL, SCANFLOW_LOG_LEVEL, SCANFLOW_SPOOL_DIR. `prog` names the command in errors.

    `--threads N` pins the thread pool; SCANFLOW_THREADS only sets its starting size, and the replica
    still follows later changes of its cgroup CPU limit (an in-place pod resize changes no env).
    `args.threads_pinned` says which.
    """
    env = os.environ if env is None else env
    p = replica_parser(prog)
    args = p.parse_args(argv)
    args.threads_pinned = args.threads is not None
    if args.model_uri is None:
        args.model_uri = env.get("SCANFLOW_MODEL_URI", "").strip() or None
    if args.model_uri is None:
        p.error("--model-uri (or SCANFLOW_MODEL_URI) is required")
    if args.port is None:
        args.port = env_value(p, env, "SCANFLOW_PORT", int)
    if args.port is None:
        p.error("--port (or SCANFLOW_PORT) is required")
    args.host = args.host or env.get("SCANFLOW_HOST", "").strip() or "127.0.0.1"
    if args.threads is None:
        args.threads = env_value(p, env, "SCANFLOW_THREADS", int)
    if args.max_batch_size is None:
        args.max_batch_size = env_value(p, env, "SCANFLOW_MAX_BATCH_SIZE", int) or 32
    if args.max_batch_wait_ms is None:
        wait = env_value(p, env, "SCANFLOW_MAX_BATCH_WAIT_MS", float)
        args.max_batch_wait_ms = 2.0 if wait is None else wait
    args.tracker_url = args.tracker_url or env.get("SCANFLOW_TRACKER_URL", "").strip() or None
    args.service = args.service or env.get("SCANFLOW_SERVICE", "").strip() or "default"
    args.log_level = args.log_level or env.get("SCANFLOW_LOG_LEVEL", "").strip() or "INFO"
    if args.threads is not None and args.threads < 1:
        p.error("--threads / SCANFLOW_THREADS must be >= 1")
    if args.max_batch_size < 1 or args.max_batch_wait_ms < 0 or args.cpu_watch_s < 0:
        p.error("--max-batch-size must be >= 1, --max-batch-wait-ms and --cpu-watch-s >= 0")
    if args.head_timeout_s is None:
        head = env_value(p, env, "SCANFLOW_HEAD_TIMEOUT_S", float)
        args.head_timeout_s = DEFAULT_HEAD_TIMEOUT_S if head is None else head
    if args.body_timeout_s <= 0 or args.head_timeout_s <= 0 or args.spool_max_mb <= 0 or args.spool_fsync_s <= 0:
        p.error("--body-timeout-s, --head-timeout-s, --spool-max-mb and --spool-fsync-s must be > 0")
    spool = args.spool_dir or env.get("SCANFLOW_SPOOL_DIR", "").strip() or None
    if spool is None:  # stable across restarts of the same replica: its id, else its service and port
        spool = os.path.join("scanflow-spool", args.replica_id or f"{args.service}-{args.port}")
    args.spool_dir = None if spool.lower() == "none" or not args.tracker_url else spool
    key = env.get(SERVICE_RECORD_KEY_ENV, "").strip()
    try:
        args.record_key = parse_key(key, SERVICE_RECORD_KEY_ENV) if key else None
    except RecordKeyError as exc:
        p.error(str(exc))
    return args


def main(argv: list[str] | None = None, prog: str = REPLICA_PROG) -> None:
    """Parse the flags and serve until stopped. Who calls: `python -m` (the platforms' command lines)
    and `scanflow serve replica` (with its own `prog`)."""
    from scanflow.settings import Settings

    args = parse_args(argv, prog=prog)
    settings = Settings()
    config = ReplicaConfig(
        model_uri=args.model_uri,
        service=args.service,
        replica_id=args.replica_id or f"{args.service}-{os.getpid()}",
        threads=args.threads,
        threads_pinned=args.threads_pinned,
        cpu_watch_s=args.cpu_watch_s,
        max_batch_size=args.max_batch_size,
        max_batch_wait_ms=args.max_batch_wait_ms,
        tracker_url=args.tracker_url,
        token=settings.token,
        allow_anonymous=args.allow_anonymous,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        spool_dir=args.spool_dir,
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)),
        spool_fsync_s=args.spool_fsync_s,
        allow_local_models=args.allow_local_models,
        record_key=args.record_key,
    )
    run_server(create_app(config), args.host, args.port, args.log_level, head_timeout_s=args.head_timeout_s)


if __name__ == "__main__":
    main()
