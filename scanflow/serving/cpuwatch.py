"""Follow this process's cgroup CPU limit, so a replica's thread pool follows an in-place pod resize.

Kubernetes' in-place resize (`pods/resize`) changes the container's cgroup CPU quota but not its env,
so `SCANFLOW_THREADS` goes stale: a replica that keeps 4 threads under a 1-core quota gets throttled,
one that keeps 1 thread under 4 cores wastes them. The replica (scanflow.serving.replica) reads the
quota every few seconds through `CpuLimitReader` and resizes `torch.set_num_threads` when it changes.

Pure parts (tested without a cgroup): quota text -> cores (`cores_from_cpu_max`, `cores_from_cfs`),
cores -> threads (`threads_for_cores`). `CpuLimitReader` only reads files: /proc/self/mounts once,
then /proc/self/cgroup and the quota files of this process's group and its ancestors (the tightest
limit wins) on each `read()`: a handful of tiny reads, cheap enough to repeat every few seconds.
Both cgroup v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`) are supported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from scanflow.platform.cgroups import CFS_PERIOD_US, _parse_mounts, detect_from


def cores_from_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max`: '200000 100000' -> 2.0; 'max 100000' or unreadable text -> None (no limit)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else CFS_PERIOD_US
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cores_from_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1: cfs_quota_us '-1' (no limit) -> None; '150000' over '100000' -> 1.5."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def threads_for_cores(cores: float | None, available: int) -> int:
    """Threads for a CPU limit: one per whole core (at least 1), never more than the CPUs we may run on.

    Same rule as `scanflow.platform.k8s_resources.default_threads`, so a pod resized in place ends up with
    the thread count a freshly created pod of that size would get. No limit -> every available CPU.
    """
    available = max(1, available)
    if cores is None:
        return available
    return max(1, min(available, math.floor(cores + 1e-9)))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class CpuLimitReader:
    """Reads the CPU limit (cores, None = unlimited/unknown) of the cgroup this process is in.

    `proc` is /proc by default; tests pass a fake directory holding `self/mounts` and `self/cgroup`
    whose mount points lead to a fake cgroup tree.
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        mounts = _read(proc / "self/mounts") or ""
        self._mounts = mounts
        controllers = None
        for fstype, point, _ in _parse_mounts(mounts):
            if fstype == "cgroup2":
                controllers = _read(Path(point) / "cgroup.controllers")
                break
        self._v2_controllers = controllers
        self._mount_points = {ctrl: Path(point) for fstype, point, opts in _parse_mounts(mounts)
                              for ctrl in (["unified"] if fstype == "cgroup2" else opts)}

    def read(self) -> float | None:
        """The tightest CPU limit along this process's group and its ancestors, in cores."""
        self_cg = _read(self.proc / "self/cgroup")
        if self_cg is None:
            return None
        sup = detect_from(self._mounts, self_cg, self._v2_controllers)
        if sup.version == "v2":
            base, root = sup.bases["unified"], self._mount_points.get("unified")
            return _tightest(base, root, lambda d: cores_from_cpu_max(_read(d / "cpu.max") or ""))
        if sup.version == "v1" and "cpu" in sup.bases:
            base, root = sup.bases["cpu"], self._mount_points.get("cpu")
            return _tightest(base, root, lambda d: cores_from_cfs(
                _read(d / "cpu.cfs_quota_us") or "", _read(d / "cpu.cfs_period_us") or ""))
        return None


def _tightest(base: Path, root: Path | None, limit_of: Callable[[Path], float | None]) -> float | None:
    """Min over `base` and its parents up to the mount point `root` (a parent's quota caps children)."""
    best: float | None = None
    d = base
    for _ in range(64):  # bounded: cgroup trees are shallow
        cores = limit_of(d)
        if cores is not None and (best is None or cores < best):
            best = cores
        if root is None or d == root or d.parent == d or root not in d.parents:
            break
        d = d.parent
    return best
