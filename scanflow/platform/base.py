"""The Platform protocol: the one place that knows where services and jobs run.

Implementations: `scanflow.platform.local.LocalPlatform` (embedded default: OS processes on this
machine) and `scanflow.platform.kubernetes.KubernetesPlatform`. Both only *apply* desired state,
declaratively and repeatably (calling twice with the same arguments changes nothing the second time);
the decisions (how many replicas, which cores) are computed elsewhere, by pure functions.

Methods are synchronous and may block (processes, Kubernetes API, MLflow): async callers run them in
a thread pool (`await asyncio.to_thread(platform.scale, "svc", 3)`).
Who calls: the Executor agent's actuators, the CLI (`scanflow deploy`), tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from scanflow.spec import Affinity, Job, Resources, Service

if TYPE_CHECKING:
    from scanflow.platform.readback import Wanted


class PlatformError(RuntimeError):
    """An operation could not be applied. `retryable` tells the caller whether to try again later."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class ReplicaStatus:
    """What is really applied to one replica (read back from the OS / cluster, not what was asked)."""

    name: str
    ready: bool
    address: str | None = None  # "http://127.0.0.1:PORT" or pod IP
    pid: int | None = None
    cpus: tuple[int, ...] | None = None  # cores it may run on (Cpus_allowed_list), None if unknown
    cpu_quota: float | None = None  # cores from a CFS quota, None if unlimited/unknown
    memory_limit: int | None = None  # bytes, None if unlimited/unknown
    threads: int | None = None
    model_version: str | None = None


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    desired_replicas: int
    replicas: tuple[ReplicaStatus, ...] = ()
    endpoint: str | None = None  # the gateway / Service address clients use
    routed_to: str | None = None  # the service receiving traffic (itself, or its backup on failover)
    notes: tuple[str, ...] = ()  # e.g. "cgroup v2 not writable: memory limit not applied"

    @property
    def ready_replicas(self) -> int:
        return sum(1 for r in self.replicas if r.ready)


@dataclass(frozen=True)
class ResourceChange:
    """Outcome of set_resources: how it was applied and what could not be."""

    service: str
    method: str  # "in-place", "rolling-update", "affinity+cgroup", ...
    applied: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # what the replicas must show once the change took effect (scanflow.platform.readback), for the
    # caller to read back from `status()`; None: the platform cannot say
    wanted: Wanted | None = None


@dataclass(frozen=True)
class JobResult:
    name: str
    succeeded: bool
    run_id: str | None = None  # the MLflow run holding logs and outcome
    exit_code: int | None = None
    duration_s: float | None = None
    message: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Platform(Protocol):
    """Apply desired state for services and jobs. Every method is idempotent."""

    def deploy(self, service: Service) -> ServiceStatus:
        """Create or update the service (replicas, gateway/Service). Returns once it is ready."""
        ...

    def scale(self, service: str, replicas: int) -> ServiceStatus:
        """Set the replica count; removed replicas are drained (no failed request)."""
        ...

    def set_resources(
        self, service: str, resources: Resources, affinity: Affinity | None = None,
        threads: int | None = None,
    ) -> ResourceChange:
        """Change CPU/memory/affinity per replica; replicas resize their thread pools after it."""
        ...

    def route(self, service: str, to: str | None = None) -> ServiceStatus:
        """Send `service`'s traffic to the service `to` (failover), or back to itself when None."""
        ...

    def swap_model(self, service: str, model_uri: str) -> ServiceStatus:
        """Hot-swap the model every replica serves (load beside, switch atomically, drain)."""
        ...

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow",
                       share: float = 0.0, delivery: str | None = None) -> ServiceStatus:
        """Make the service `challenger` a progressive delivery's challenger behind `service`'s endpoint:
        `mode` shadow (`share` of the answered requests mirrored to it) or canary (`share` answered by
        it); None takes it off. `delivery` names the delivery on every gateway. The same call again
        changes nothing, except on a gateway that lost its challenger (restarted, new): it gets it back."""
        ...

    def run_job(self, job: Job, params: dict[str, Any] | None = None) -> JobResult:
        """Run a batch job to completion (or timeout); logs and outcome go to an MLflow run."""
        ...

    def status(self, service: str) -> ServiceStatus:
        ...

    def delete(self, service: str) -> None:
        """Stop and remove the service; a no-op when it does not exist."""
        ...

    def close(self) -> None:
        """Release everything this platform object started (local: processes)."""
        ...
