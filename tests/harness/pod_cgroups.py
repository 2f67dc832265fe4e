"""The emulated kubelet's CPU limits: one cgroup per container process, its CFS quota from the
container's `resources.limits.cpu`, rewritten when the pod is resized in place.

Why: S2 and S3 need a replica that a CPU limit holds, as a kubelet's container cgroup does, and a
resize that changes what it may use (an in-place resize on a node rewrites the cgroup, the process
keeps running). The replica reads its own limit and throttling from its cgroup (scanflow.serving.
cpustat), so the Checker observes here what it observes on a node. Built on the platform's own
cgroup helper (scanflow.platform.cgroups, v1 or v2), under a prefix of this run, removed at close.
An emulation: memory limits are not applied (every pod runs this machine's Python with torch, whose
footprint is not an image's); requests reserve nothing (no CPU shares).
"""

from __future__ import annotations

import secrets
import subprocess
import time
from typing import Any

from scanflow.platform.cgroups import CgroupManager, detect
from scanflow.platform.k8s_resources import normalise


def cpu_limit(container: dict[str, Any]) -> float | None:
    """Pure: the container's CPU limit in cores (None: no limit)."""
    value = ((container.get("resources") or {}).get("limits") or {}).get("cpu")
    return None if value in (None, "") else normalise("cpu", value)


class PodCgroups:
    """`apply` when a container's process starts or its pod is resized; `limit` reads the quota back.
    `reason` says why limits cannot be applied here ('' when they can): found by applying one to a
    short-lived process at start, since writable cgroup files are not enough (on cgroup v2 a group that
    holds processes, as the harness's own does, cannot hand the cpu controller to groups below it)."""

    def __init__(self) -> None:
        self.manager = CgroupManager(detect(), prefix=f"scanflow-harness-{secrets.token_hex(3)}")
        self.reason = self.manager.support.reason if not self.manager.support.usable else self._probe()

    def _probe(self) -> str:
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            notes = self.apply("probe", {"name": "c", "resources": {"limits": {"cpu": "500m"}}}, sleeper.pid)
            got = self.limit("probe", "c")
        finally:
            sleeper.kill()
            sleeper.wait(10)
        if notes or got is None or abs(got - 0.5) > 1e-6:
            return "; ".join(notes) or f"a 0.5-core limit read back as {got}"
        return ""

    @staticmethod
    def group(pod: str, container: str) -> str:
        return f"{pod}.{container}"

    def apply(self, pod: str, container: dict[str, Any], pid: int) -> list[str]:
        """Put `pid` (the container's process) under the container's CPU limit; notes on what failed."""
        return self.manager.apply(self.group(pod, str(container.get("name"))), pid, cpu=cpu_limit(container),
                                  memory=None)

    def limit(self, pod: str, container: str) -> float | None:
        """The CFS quota the kernel holds for the container now, in cores (None: unlimited or unknown)."""
        return self.manager.read(self.group(pod, container)).cpu_quota

    def close(self, timeout_s: float = 15.0) -> list[str]:
        """Remove every group of this run; a group empties only once its killed processes are gone, so
        retry until `timeout_s`. Returns the groups left (named in the harness's events)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.manager.remove_all()
            left = [str(base / self.manager.prefix) for base in self.manager.support.bases.values()
                    if (base / self.manager.prefix).exists()]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)  # waiting for the kernel to reap the killed processes: no event to await
