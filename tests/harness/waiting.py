"""Small helpers the harness's scenarios share: polling for a condition, a Service's address."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .cluster import Cluster


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    """Poll `cond` until it returns something truthy (an exception counts as not yet), else TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = cond()
        except Exception:  # noqa: BLE001  # not up yet
            got = None
        if got:
            return got
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def svc(cluster: Cluster, name: str, port: int = 8080) -> str:
    return f"http://{cluster.service_ip(name)}:{port}"


def deployment_ready(cluster: Cluster, name: str) -> bool:
    dep = cluster.get("apps/v1", "Deployment", name)
    return bool(dep) and int((dep.get("status") or {}).get("readyReplicas") or 0) >= int(dep["spec"].get("replicas", 1))
