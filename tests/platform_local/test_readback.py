"""The read-back comparison the Executor runs after a resources plan (scanflow.platform.readback), and
the Kubernetes platform's statement of what a pod's status must show (k8s_resize.wanted_resources)."""

from __future__ import annotations

from scanflow.platform.base import ReplicaStatus, ServiceStatus
from scanflow.platform.k8s_resize import wanted_resources
from scanflow.platform.readback import Wanted, compare


def _status(*replicas: ReplicaStatus) -> ServiceStatus:
    return ServiceStatus(name="svc", desired_replicas=len(replicas), replicas=replicas)


def _rep(name: str = "svc-1", *, quota: float | None = 0.3, mem: int | None = 2**29, threads: int | None = 1,
         cpus: tuple[int, ...] | None = (1,), ready: bool = True) -> ReplicaStatus:
    return ReplicaStatus(name=name, ready=ready, cpu_quota=quota, memory_limit=mem, threads=threads, cpus=cpus)


WANT = Wanted(cpu_quota=0.3, memory_limit=2**29, cpus={"svc-1": (1,)}, replica_threads={"svc-1": 1})


def test_what_took_effect_passes() -> None:
    got = compare(WANT, _status(_rep()))
    assert got.ok and got.mismatches == ()
    assert got.observed["svc-1"] == {"cpu_quota": 0.3, "memory_limit": 2**29, "threads": 1, "cpus": [1]}


def test_quota_within_the_kernels_rounding_passes() -> None:
    assert compare(WANT, _status(_rep(quota=0.30001))).ok
    assert compare(Wanted(cpu_quota=0.001), _status(_rep(quota=0.01))).ok  # the 1 ms floor


def test_each_field_that_did_not_take_effect_is_named() -> None:
    got = compare(WANT, _status(_rep(quota=None, mem=None, threads=2, cpus=(0, 1))))
    assert not got.ok
    text = " | ".join(got.mismatches)
    assert "CPU quota unlimited, wanted 0.3 cores" in text
    assert "memory limit None" in text and "2 threads, wanted 1" in text and "allowed cores [0, 1]" in text


def test_an_old_quota_is_a_mismatch() -> None:
    assert not compare(WANT, _status(_rep(quota=1.0))).ok
    assert not compare(Wanted(cpu_quota=None), _status(_rep(quota=1.0))).ok  # a limit left where none is wanted


def test_no_ready_replica_is_not_success() -> None:
    got = compare(WANT, _status(_rep(ready=False)))
    assert not got.ok and "no ready replica" in got.mismatches[0]
    assert not compare(WANT, _status()).ok


def test_unchecked_fields_and_replicas_started_later() -> None:
    # a replica that was still starting has no per-replica expectation: only the service-wide ones apply
    got = compare(WANT, _status(_rep(), _rep("svc-2", cpus=(0,), threads=4)))
    assert got.ok, got.mismatches
    assert not compare(Wanted(cpu_quota=0.3, threads=1), _status(_rep("svc-2", threads=4))).ok


def test_kubernetes_wanted_from_the_container_resources() -> None:
    burstable = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}
    w = wanted_resources(burstable, None)
    assert w == Wanted(cpu_quota=None, memory_limit=512 * 2**20, threads=None)
    guaranteed = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert wanted_resources(guaranteed, 2) == Wanted(cpu_quota=2.0, memory_limit=2**30, threads=2)
    # a pod whose status still shows the old limits (resize pending) is a mismatch
    pod = ReplicaStatus(name="digits-a", ready=True, cpu_quota=1.0, memory_limit=2**30)
    assert not compare(wanted_resources(guaranteed, None), _status(pod)).ok
