"""The replica's and the gateway's command-line flags, and environment variables as their defaults.

The flags are defined once, here (`replica_parser`, `gateway_parser`): `python -m
scanflow.serving.replica|gateway` parse them with argparse (`parse_args` in each module adds the env
defaults and the checks), and `scanflow serve replica|gateway` (scanflow.serving.cli) makes its typer
options from the same definitions, so the platforms' command lines and the CLI cannot drift apart.
This module imports nothing heavy: the CLI builds its command tree from it on every `scanflow` call.

Who calls: `scanflow.serving.replica.parse_args`, `scanflow.serving.gateway.parse_args`,
`scanflow.serving.cli`. Containers (deploy/base, docker-compose.yml, `scanflow.platform.manifests`)
configure those processes partly by env (`SCANFLOW_HOST=0.0.0.0`, `SCANFLOW_THREADS`, `SCANFLOW_UPSTREAM`, ...); reading them here, in one
place, keeps the manifests and the processes from drifting apart. The mapping is passed in so tests
need not touch `os.environ`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")

REPLICA_PROG = "python -m scanflow.serving.replica"
GATEWAY_PROG = "python -m scanflow.serving.gateway"


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser named `prog`. Under `scanflow serve ...` (any prog but `python -m ...`) its
    errors show typer's short usage line, not argparse's list of every flag."""
    usage = None if prog.startswith("python -m ") else f"{prog} [OPTIONS] (--help: the options)"
    return argparse.ArgumentParser(prog=prog, usage=usage, description=description)


def replica_parser(prog: str = REPLICA_PROG) -> argparse.ArgumentParser:
    """The replica's flags (scanflow.serving.replica): names, types, defaults and help, no env."""
    p = _parser(prog, "The inference replica: one process serving one model over HTTP.")
    p.add_argument("--model-uri", default=None, help="models:/name@alias, runs:/... (env SCANFLOW_MODEL_URI)")
    p.add_argument("--port", type=int, default=None, help="env SCANFLOW_PORT")
    p.add_argument("--host", default=None, help="env SCANFLOW_HOST, else 127.0.0.1")
    p.add_argument("--threads", type=int, default=None,
                   help="pin the torch thread pool (env SCANFLOW_THREADS: starting size that follows the CPU limit)")
    p.add_argument("--max-batch-size", type=int, default=None, help="env SCANFLOW_MAX_BATCH_SIZE, else 32")
    p.add_argument("--max-batch-wait-ms", type=float, default=None, help="env SCANFLOW_MAX_BATCH_WAIT_MS, else 2")
    p.add_argument("--tracker-url", default=None, help="env SCANFLOW_TRACKER_URL")
    p.add_argument("--service", default=None, help="env SCANFLOW_SERVICE, else 'default'")
    p.add_argument("--replica-id", default=None)
    p.add_argument("--allow-anonymous", action="store_true")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--body-timeout-s", type=float, default=10.0,
                   help="a request body must arrive in full within this (else 408 and the connection closes)")
    p.add_argument("--head-timeout-s", type=float, default=None,
                   help="a request line and headers must arrive in full within this (else 408 and the "
                        "connection closes; env SCANFLOW_HEAD_TIMEOUT_S, else 10)")
    p.add_argument("--spool-dir", default=None,
                   help="durable record spool (with --tracker-url; env SCANFLOW_SPOOL_DIR, else "
                        "./scanflow-spool/<replica-id or service-port>; 'none': memory only)")
    p.add_argument("--spool-max-mb", type=float, default=256.0, help="spool bound; newer records refused over it")
    p.add_argument("--spool-fsync-s", type=float, default=1.0, help="how often the spool is fsynced")
    p.add_argument("--allow-local-models", action="store_true",
                   help="POST /admin/model may load file:// URIs and paths (else models:/ and runs:/ only)")
    p.add_argument("--cpu-watch-s", type=float, default=5.0,
                   help="how often to re-read the cgroup CPU limit and resize the thread pool (0: never)")
    p.add_argument("--log-level", default=None, help="env SCANFLOW_LOG_LEVEL, else INFO")
    return p


def gateway_parser(prog: str = GATEWAY_PROG) -> argparse.ArgumentParser:
    """The gateway's flags (scanflow.serving.gateway): names, types, defaults and help, no env."""
    p = _parser(prog, "The gateway: one endpoint per service in front of its replicas.")
    p.add_argument("--port", type=int, default=None, help="env SCANFLOW_PORT")
    p.add_argument("--host", default=None, help="env SCANFLOW_HOST, else 127.0.0.1")
    p.add_argument("--service", default=None, help="env SCANFLOW_SERVICE, else 'default'")
    p.add_argument("--replica", action="append", default=[],
                   help="replica base URL (repeatable; env SCANFLOW_UPSTREAM, comma-separated)")
    p.add_argument("--backup", default=None,
                   help="base URL taking traffic when no replica is healthy (env SCANFLOW_BACKUP)")
    p.add_argument("--health-interval-s", type=float, default=0.5)
    p.add_argument("--upstream-timeout-s", type=float, default=30.0)
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--body-timeout-s", type=float, default=10.0,
                   help="a request body must arrive in full within this (else 408 and the connection closes)")
    p.add_argument("--head-timeout-s", type=float, default=None,
                   help="a request line and headers must arrive in full within this (else 408 and the "
                        "connection closes; env SCANFLOW_HEAD_TIMEOUT_S, else 10)")
    p.add_argument("--coalesce-max", type=int, default=64,
                   help="client requests per upstream call (POST /predict_batch); 0 or 1 forwards each alone")
    p.add_argument("--batches-per-replica", type=int, default=1, help="coalesced calls in flight per replica")
    p.add_argument("--front", choices=("fast", "asgi"), default=None,
                   help="fast (default): the common POST /predict answered from the HTTP protocol, no ASGI "
                        "cycle (scanflow.serving.fastfront); asgi: every request through uvicorn's ASGI cycle "
                        "(env SCANFLOW_GATEWAY_FRONT)")
    p.add_argument("--upstream-discovery", choices=("static", "dns"), default=None,
                   help="static (default): the --replica URLs are the replicas; dns: each names a set of replicas, "
                        "one per address it resolves to, re-resolved every health interval (a Kubernetes headless "
                        "Service) (env SCANFLOW_UPSTREAM_DISCOVERY)")
    p.add_argument("--allow-anonymous", action="store_true")
    p.add_argument("--log-level", default=None, help="env SCANFLOW_LOG_LEVEL, else INFO")
    return p


def env_value(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    name: str,
    convert: Callable[[str], T],
) -> T | None:
    """`convert(env[name])`, None when unset or blank; a bad value exits with a message naming `name`."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return convert(raw)
    except ValueError:
        parser.error(f"environment variable {name}={raw!r} is not a valid {getattr(convert, '__name__', 'value')}")
    return None  # pragma: no cover - parser.error exits


def url_list(text: str) -> list[str]:
    """'http://a:1, http://b:2' -> ['http://a:1', 'http://b:2'] (SCANFLOW_UPSTREAM may list several)."""
    return [u.strip() for u in text.replace(";", ",").split(",") if u.strip()]
