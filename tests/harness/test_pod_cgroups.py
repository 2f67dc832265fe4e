"""The emulated kubelet's CPU limits (pod_cgroups.py): a real cgroup on this machine holds a real
process to the container's limit, and a resize rewrites it; skipped where cgroups are not writable."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from .pod_cgroups import PodCgroups, cpu_limit


def test_cpu_limit_reads_the_container_limit() -> None:
    assert cpu_limit({"resources": {"limits": {"cpu": "250m", "memory": "1Gi"}}}) == 0.25
    assert cpu_limit({"resources": {"limits": {"cpu": 2}}}) == 2.0
    assert cpu_limit({"resources": {"requests": {"cpu": "1"}}}) is None
    assert cpu_limit({}) is None


def test_a_container_process_is_held_to_its_limit_and_a_resize_rewrites_it() -> None:
    cgroups = PodCgroups()
    if cgroups.reason:
        pytest.skip(f"no writable cgroups here: {cgroups.reason}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        notes = cgroups.apply("pod-a", {"name": "replica", "resources": {"limits": {"cpu": "100m"}}}, busy.pid)
        assert notes == []
        assert cgroups.limit("pod-a", "replica") == pytest.approx(0.1)
        import psutil

        proc = psutil.Process(busy.pid)
        t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
        time.sleep(2.0)  # a measurement window, not a synchronisation
        used = (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
        assert used < 0.2, f"a busy loop under a 0.1-core limit used {used:.2f} cores"
        cgroups.apply("pod-a", {"name": "replica", "resources": {"limits": {"cpu": "500m"}}}, busy.pid)
        assert cgroups.limit("pod-a", "replica") == pytest.approx(0.5)
        cgroups.apply("pod-a", {"name": "replica", "resources": {}}, busy.pid)
        assert cgroups.limit("pod-a", "replica") is None
    finally:
        busy.kill()
        busy.wait(10)
        cgroups.close()
