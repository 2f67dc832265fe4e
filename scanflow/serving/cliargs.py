"""Environment variables as defaults for the replica and gateway command-line flags (flags win).

Who calls: `scanflow.serving.replica.parse_args` and `scanflow.serving.gateway.parse_args`. Containers
(deploy/base, docker-compose.yml, `scanflow.platform.manifests`) configure those processes partly by
env (`SCANFLOW_HOST=0.0.0.0`, `SCANFLOW_THREADS`, `SCANFLOW_UPSTREAM`, ...); reading them here, in one
place, keeps the manifests and the processes from drifting apart. The mapping is passed in so tests
need not touch `os.environ`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")


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
