"""What a `set_resources` asked for, compared with what the replicas really run (read back).

Why: a platform call that returned is not a change that took effect. A cgroup write can be refused
(not root, a read-only mount), a pod resize can stay pending on its node, a replica can keep its
old thread pool. The Executor reports a resources plan as done only after the platform's status
(local: the cgroup files, /proc Cpus_allowed_list, the replica's own /info thread count; Kubernetes:
the pod's status resources, what the kubelet applied) shows what the plan asked for; otherwise it
says what differs.

Pure: `compare(wanted, status)` -> `Readback`. Who calls: scanflow/standard/executor.py (`set_resources`);
the platforms build the `Wanted` (scanflow.platform.local / kubernetes `set_resources`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scanflow.platform.base import ReplicaStatus, ServiceStatus

QUOTA_TOLERANCE = 0.011  # cores: the CFS quota is whole microseconds and at least 1 ms (0.01 core)


@dataclass(frozen=True)
class Wanted:
    """What every ready replica of the service must show once the change took effect.

    cpu_quota: cores of CFS quota (None: no CPU limit wanted, e.g. a Burstable pod).
    memory_limit: bytes (None: not checked).
    threads: the replica's thread pool (None: not checked, e.g. an in-place pod resize whose replica
      follows its CPU limit by itself).
    cpus: replica name -> the cores it must be allowed to run on (absent: not checked).
    replica_threads: replica name -> its thread pool, where it differs per replica (wins over threads).
    check_quota: False where the platform has no way to read a quota back (then it is not checked).
    """

    cpu_quota: float | None
    memory_limit: int | None = None
    threads: int | None = None
    cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    replica_threads: dict[str, int] = field(default_factory=dict)
    check_quota: bool = True


@dataclass(frozen=True)
class Readback:
    """The comparison: ok when every ready replica shows what was wanted (and at least one is ready)."""

    ok: bool
    mismatches: tuple[str, ...]
    observed: dict[str, dict[str, Any]]  # replica name -> what was read back


def _observed(r: ReplicaStatus) -> dict[str, Any]:
    return {"cpu_quota": r.cpu_quota, "memory_limit": r.memory_limit, "threads": r.threads,
            "cpus": list(r.cpus) if r.cpus is not None else None}


def _fmt(cores: float | None) -> str:
    return "unlimited" if cores is None else f"{cores:g} cores"


def _same_quota(wanted: float | None, seen: float | None) -> bool:
    if wanted is None or seen is None:
        return wanted is None and seen is None
    return abs(wanted - seen) <= max(QUOTA_TOLERANCE, 0.01 * wanted)


def compare(wanted: Wanted, status: ServiceStatus) -> Readback:
    """Pure: each ready replica's read-back values against `wanted`; mismatches say replica, field,
    wanted and seen. No ready replica is a mismatch too (nothing shows the change took effect)."""
    ready = [r for r in status.replicas if r.ready]
    out: list[str] = []
    if not ready:
        out.append(f"service {status.name!r}: no ready replica to read the change back from")
    for r in ready:
        if wanted.check_quota and not _same_quota(wanted.cpu_quota, r.cpu_quota):
            out.append(f"{r.name}: CPU quota {_fmt(r.cpu_quota)}, wanted {_fmt(wanted.cpu_quota)}")
        if wanted.memory_limit is not None and r.memory_limit != wanted.memory_limit:
            out.append(f"{r.name}: memory limit {r.memory_limit}, wanted {wanted.memory_limit}")
        threads = wanted.replica_threads.get(r.name, wanted.threads)
        if threads is not None and r.threads != threads:
            out.append(f"{r.name}: {r.threads} threads, wanted {threads}")
        cpus = wanted.cpus.get(r.name)
        if cpus is not None and (r.cpus is None or tuple(sorted(r.cpus)) != tuple(sorted(cpus))):
            out.append(f"{r.name}: allowed cores {list(r.cpus) if r.cpus is not None else 'unknown'}, "
                       f"wanted {list(cpus)}")
    return Readback(not out, tuple(out), {r.name: _observed(r) for r in ready})
