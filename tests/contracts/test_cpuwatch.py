"""Thread pools follow CPU: cgroup quota text -> cores -> threads, read from a fake cgroup tree (v1, v2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanflow.serving.cpuwatch import CpuLimitReader, cores_from_cfs, cores_from_cpu_max, threads_for_cores


@pytest.mark.parametrize(("text", "cores"), [
    ("200000 100000\n", 2.0), ("50000 100000", 0.5), ("max 100000\n", None), ("", None), ("garbage x", None),
    ("150000", 1.5),
])
def test_cpu_max(text: str, cores: float | None) -> None:
    assert cores_from_cpu_max(text) == cores


@pytest.mark.parametrize(("quota", "period", "cores"), [
    ("-1\n", "100000\n", None), ("300000", "100000", 3.0), ("25000", "50000", 0.5), ("x", "1", None), ("1", "0", None),
])
def test_cfs(quota: str, period: str, cores: float | None) -> None:
    assert cores_from_cfs(quota, period) == cores


@pytest.mark.parametrize(("cores", "available", "threads"), [
    (None, 8, 8), (2.0, 8, 2), (2.9, 8, 2), (0.5, 8, 1), (16.0, 4, 4), (1.9999999999, 8, 2), (None, 0, 1),
])
def test_threads_for_cores(cores: float | None, available: int, threads: int) -> None:
    assert threads_for_cores(cores, available) == threads


def _fake_proc(tmp_path: Path, mounts: str, self_cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self/mounts").write_text(mounts)
    (proc / "self/cgroup").write_text(self_cgroup)
    return proc


def test_reader_v2_follows_changes_and_parent_caps(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    pod = root / "kubepods/pod1"
    ctr = pod / "ctr"
    ctr.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (ctr / "cpu.max").write_text("max 100000\n")
    proc = _fake_proc(tmp_path, f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n", "0::/kubepods/pod1/ctr\n")
    reader = CpuLimitReader(proc)
    assert reader.read() is None
    (ctr / "cpu.max").write_text("400000 100000\n")  # in-place resize to 4 cores
    assert reader.read() == 4.0
    (pod / "cpu.max").write_text("150000 100000\n")  # the pod-level cap is tighter
    assert reader.read() == 1.5
    (proc / "self/cgroup").write_text("0::/elsewhere\n")  # moved to a group that does not exist
    assert reader.read() is None


def test_reader_v1_cfs(tmp_path: Path) -> None:
    cpu = tmp_path / "cpu,cpuacct"
    grp = cpu / "scanflow/r1"
    grp.mkdir(parents=True)
    (grp / "cpu.cfs_quota_us").write_text("-1\n")
    (grp / "cpu.cfs_period_us").write_text("100000\n")
    mounts = (f"cgroup {cpu} cgroup rw,nosuid,cpu,cpuacct 0 0\n"
              f"cgroup2 {tmp_path / 'unified'} cgroup2 rw 0 0\n")  # hybrid: empty v2 next to v1
    proc = _fake_proc(tmp_path, mounts, "4:cpu,cpuacct:/scanflow/r1\n0::/\n")
    reader = CpuLimitReader(proc)
    assert reader.read() is None
    (grp / "cpu.cfs_quota_us").write_text("200000\n")
    assert reader.read() == 2.0


def test_reader_without_cgroups(tmp_path: Path) -> None:
    assert CpuLimitReader(tmp_path / "nothing").read() is None
    proc = _fake_proc(tmp_path, "proc /proc proc rw 0 0\n", "0::/\n")
    assert CpuLimitReader(proc).read() is None


class _ScriptedLimit:
    """Stands in for CpuLimitReader: returns the limit the test sets (the files are tested above)."""

    def __init__(self) -> None:
        self.cores: float | None = None

    def read(self) -> float | None:
        return self.cores


async def _until(cond: object, timeout_s: float = 5.0) -> None:
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_replica_resizes_pool_on_limit_change_until_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from scanflow.serving import replica_server as rep

    monkeypatch.setattr(rep, "available_cpus", lambda: list(range(8)))
    r = rep.Replica(rep.ReplicaConfig(model_uri="models:/m@champion", threads=1, cpu_watch_s=0.01))
    assert r.cpu_reader is not None and not r.threads_pinned
    limit = _ScriptedLimit()
    r.cpu_reader = limit  # type: ignore[assignment]
    applied: list[int] = []

    async def apply(n: int) -> None:  # torch.set_num_threads is not what is under test here
        applied.append(n)
        r.threads = n

    monkeypatch.setattr(r, "_apply_threads", apply)
    task = asyncio.create_task(r._follow_cpu_limit())
    try:
        limit.cores = 3.0
        await _until(lambda: r.threads == 3)
        limit.cores = None  # limit lifted: every CPU we may run on
        await _until(lambda: r.threads == 8)
        r.threads_pinned = True  # what POST /admin/threads does
        limit.cores = 2.0
        await _until(lambda: task.done())
        assert applied == [3, 8] and r.threads == 8
    finally:
        task.cancel()


def test_pinned_replica_does_not_watch() -> None:
    from scanflow.serving import replica_server as rep

    r = rep.Replica(rep.ReplicaConfig(model_uri="m", threads=2, threads_pinned=True))
    assert r.cpu_reader is None and r.threads == 2 and r.threads_pinned
