"""cgroup detection (pure, from /proc text) and limits on a fake tree and on this machine."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from scanflow.platform.cgroups import (
    CgroupManager,
    CgroupSupport,
    detect,
    detect_from,
    parse_cpu_max,
    quota_v1,
    quota_v2,
)

V1_MOUNTS = """\
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_SELF = "4:memory:/sandbox/abc\n3:cpuset:/\n1:cpu:/\n0::/\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
V2_SELF = "0::/user.slice/app.scope\n"


def test_detect_hybrid_v1_uses_our_own_group_per_controller() -> None:
    sup = detect_from(V1_MOUNTS, V1_SELF, v2_controllers="")
    assert sup.version == "v1"
    assert sup.bases["memory"] == Path("/sys/fs/cgroup/memory/sandbox/abc")
    assert sup.bases["cpu"] == Path("/sys/fs/cgroup/cpu")


def test_detect_unified_v2() -> None:
    sup = detect_from(V2_MOUNTS, V2_SELF, v2_controllers="cpuset cpu io memory pids")
    assert sup.version == "v2"
    assert sup.bases == {"unified": Path("/sys/fs/cgroup/user.slice/app.scope")}


def test_detect_none() -> None:
    sup = detect_from("proc /proc proc rw 0 0\n", "", None)
    assert sup.version == "none" and "no cgroup" in sup.reason and not sup.usable


def test_quota_arithmetic() -> None:
    assert quota_v1(1.5) == (150_000, 100_000)
    assert quota_v1(0.001) == (1000, 100_000)  # kernel minimum 1 ms
    assert quota_v2(2) == "200000 100000"
    assert parse_cpu_max("50000 100000") == 0.5
    assert parse_cpu_max("max 100000") is None


def test_v2_on_a_fake_tree(tmp_path: Path) -> None:
    base = tmp_path / "app.scope"
    base.mkdir()
    mgr = CgroupManager(CgroupSupport(version="v2", bases={"unified": base}), prefix="sf")
    assert mgr.apply("svc-1", 4242, cpu=1.5, memory=256 * 2**20) == []
    d = base / "sf/svc-1"
    assert (d / "cpu.max").read_text() == "150000 100000"
    assert (d / "memory.max").read_text() == str(256 * 2**20)
    assert (d / "cgroup.procs").read_text() == "4242"
    assert (base / "sf/cgroup.subtree_control").read_text() == "+cpu +memory"
    limits = mgr.read("svc-1")
    assert limits.cpu_quota == 1.5 and limits.memory_limit == 256 * 2**20


def test_v2_refused_delegation_becomes_a_note(tmp_path: Path) -> None:
    base = tmp_path / "app.scope"
    base.mkdir()
    (base / "cgroup.subtree_control").mkdir()  # writing it fails like a refused delegation
    mgr = CgroupManager(CgroupSupport(version="v2", bases={"unified": base}))
    notes = mgr.apply("svc-1", 1, cpu=1.0, memory=None)
    assert len(notes) == 1 and "cannot enable cpu/memory controllers" in notes[0]


def test_unusable_support_says_why() -> None:
    mgr = CgroupManager(CgroupSupport(version="v1", bases={}, reason="memory group is not writable (not root)"))
    notes = mgr.apply("g", 1, cpu=1.0, memory=1 << 20)
    assert notes == ["cgroup limits not applied: memory group is not writable (not root)"]


def test_detect_on_this_machine_never_raises() -> None:
    sup = detect()
    assert sup.version in {"v1", "v2", "none"}
    if not sup.usable:
        assert sup.reason  # says why


def test_real_group_on_this_machine() -> None:
    sup = detect()
    if not sup.usable:
        pytest.skip(f"cgroups not usable here: {sup.reason}")
    mgr = CgroupManager(sup, prefix=f"scanflow-test-{uuid.uuid4().hex[:8]}")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        notes = mgr.apply("g", proc.pid, cpu=0.5, memory=64 * 2**20)
        assert notes == []
        limits = mgr.read("g")
        assert limits.cpu_quota == 0.5
        assert limits.memory_limit == 64 * 2**20
        membership = Path(f"/proc/{proc.pid}/cgroup").read_text()
        assert f"{mgr.prefix}/g" in membership
    finally:
        proc.kill()
        proc.wait()
        mgr.remove_all()
    assert not any((b / mgr.prefix).exists() for b in sup.bases.values())


def test_sweep_removes_only_empty_groups_of_dead_platforms(tmp_path: Path) -> None:
    """On a fake tree (plain directories: rmdir of one holding a file fails, as a cgroup holding a
    process does): a dead platform's empty groups and prefix go; a group still in use (an adopted
    replica's), a live platform's, our own and anything not ours stay."""
    base = tmp_path / "cpu"
    for d in ("scanflow-111/digits-1", "scanflow-111/digits-backup-1", "scanflow-222/adopt-2",
              "scanflow-333/digits-1", "scanflow-444/x", "scanflow-harness-abc/p.c", "other/z"):
        (base / d).mkdir(parents=True)
    (base / "scanflow-222/adopt-2/cgroup.procs").write_text("4242")  # still holds a process
    mgr = CgroupManager(CgroupSupport(version="v1", bases={"cpu": base}), prefix="scanflow-444")
    removed = mgr.sweep_dead(lambda pid: pid == 333)
    assert sorted(p.relative_to(base).as_posix() for p in removed) == [
        "scanflow-111", "scanflow-111/digits-1", "scanflow-111/digits-backup-1"]
    left = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_dir())
    assert left == ["other", "other/z", "scanflow-222", "scanflow-222/adopt-2", "scanflow-333",
                    "scanflow-333/digits-1", "scanflow-444", "scanflow-444/x", "scanflow-harness-abc",
                    "scanflow-harness-abc/p.c"]
