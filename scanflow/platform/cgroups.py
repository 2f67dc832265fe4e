"""CPU quota, memory limit and cpuset for replica processes through Linux cgroups (v1 or v2).

Detection is pure (`detect_from(mounts, self_cgroup)` parses /proc/self/mounts and /proc/self/cgroup
text) and `detect()` adds what only the machine can tell (writable or not). Groups are created
*under the cgroup this process already lives in* (so a sandboxed platform never escapes its own
limits): `<base>/scanflow/<group>`. Every failure becomes a note saying why (not root, read-only
mount, controller missing, v2 parent holding processes); nothing here raises into the caller.

Who calls: scanflow.platform.local (deploy / set_resources / status / delete) and its tests.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from scanflow.platform.topology import format_cpu_list

Version = Literal["v1", "v2", "none"]
CFS_PERIOD_US = 100_000
_V1_UNLIMITED = 2**62  # v1 reports ~2^63 rounded down to a page for 'no limit'


@dataclass(frozen=True)
class CgroupSupport:
    """What this machine offers: version, the directory to create groups in per controller, why not."""

    version: Version
    bases: dict[str, Path] = field(default_factory=dict)  # controller -> our own group dir
    reason: str = ""  # why limits cannot be applied ('' when they can)

    @property
    def usable(self) -> bool:
        return self.version != "none" and not self.reason


def _parse_mounts(mounts: str) -> list[tuple[str, str, list[str]]]:
    """(fstype, mountpoint, options) of every cgroup/cgroup2 mount."""
    out = []
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in {"cgroup", "cgroup2"}:
            out.append((parts[2], parts[1], parts[3].split(",")))
    return out


def _parse_self_cgroup(text: str) -> dict[str, str]:
    """'4:memory:/a/b' lines -> {'memory': '/a/b', '': '/x'} (v2 line has an empty controller list)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            paths[ctrl] = parts[2]
    return paths


def detect_from(mounts: str, self_cgroup: str, v2_controllers: str | None = None) -> CgroupSupport:
    """Pure detection. v2 when a cgroup2 mount offers cpu or memory controllers, else v1 when the
    cpu/memory hierarchies are mounted (hybrid hosts have an empty cgroup2 at .../unified), else none.

    `v2_controllers`: content of <cgroup2 mount>/cgroup.controllers (None = unknown/unreadable).
    """
    mnts = _parse_mounts(mounts)
    paths = _parse_self_cgroup(self_cgroup)
    v2 = [m for m in mnts if m[0] == "cgroup2"]
    if v2 and v2_controllers is not None and {"cpu", "memory"} & set(v2_controllers.split()):
        rel = paths.get("", "/").lstrip("/")
        base = Path(v2[0][1]) / rel
        return CgroupSupport(version="v2", bases={"unified": base})
    bases: dict[str, Path] = {}
    for fstype, point, opts in mnts:
        if fstype != "cgroup":
            continue
        for ctrl in ("cpu", "memory", "cpuset"):
            if ctrl in opts and ctrl not in bases:
                rel = paths.get(ctrl, "/").lstrip("/")
                bases[ctrl] = Path(point) / rel
    if bases:
        return CgroupSupport(version="v1", bases=bases)
    return CgroupSupport(version="none", reason="no cgroup cpu/memory controller is mounted")


def detect(proc: Path = Path("/proc")) -> CgroupSupport:
    """Detect on this machine, and say why limits cannot be applied when they cannot."""
    try:
        mounts = (proc / "self/mounts").read_text()
        self_cg = (proc / "self/cgroup").read_text()
    except OSError as exc:
        return CgroupSupport(version="none", reason=f"cannot read /proc cgroup info: {exc}")
    controllers = None
    for fstype, point, _ in _parse_mounts(mounts):
        if fstype == "cgroup2":
            try:
                controllers = (Path(point) / "cgroup.controllers").read_text()
            except OSError:
                controllers = None
            break
    sup = detect_from(mounts, self_cg, controllers)
    if sup.version == "none":
        return sup
    problems = []
    for ctrl, base in sup.bases.items():
        if not base.is_dir():
            problems.append(f"{ctrl} group {base} not visible in this mount namespace")
        elif not os.access(base, os.W_OK):
            who = "not root" if os.geteuid() != 0 else "read-only mount"
            problems.append(f"{ctrl} group {base} is not writable ({who})")
    if problems:
        return CgroupSupport(version=sup.version, bases=sup.bases, reason="; ".join(problems))
    return sup


def quota_v1(cores: float, period_us: int = CFS_PERIOD_US) -> tuple[int, int]:
    """cores -> (cfs_quota_us, cfs_period_us); the kernel refuses quotas below 1 ms."""
    return max(1000, round(cores * period_us)), period_us


def quota_v2(cores: float, period_us: int = CFS_PERIOD_US) -> str:
    """cores -> the line cpu.max expects: 'QUOTA PERIOD'."""
    q, p = quota_v1(cores, period_us)
    return f"{q} {p}"


def parse_cpu_max(text: str) -> float | None:
    """'200000 100000' -> 2.0 cores; 'max 100000' -> None (unlimited)."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    return int(parts[0]) / int(parts[1] if len(parts) > 1 else CFS_PERIOD_US)


@dataclass(frozen=True)
class Limits:
    """What is read back from a group's files (None = unlimited or unknown)."""

    cpu_quota: float | None = None
    memory_limit: int | None = None
    cpus: str | None = None


class CgroupManager:
    """Create one group per replica under our own group, apply limits, move pids, read back, remove."""

    def __init__(self, support: CgroupSupport, prefix: str = "scanflow") -> None:
        self.support = support
        self.prefix = prefix

    def _dirs(self, group: str) -> dict[str, Path]:
        return {c: base / self.prefix / group for c, base in self.support.bases.items()}

    def apply(
        self,
        group: str,
        pid: int,
        *,
        cpu: float | None,
        memory: int | None,
        cpus: tuple[int, ...] | None = None,
        mems: int | None = None,
    ) -> list[str]:
        """Put `pid` in `group` with these limits. Returns notes on what could not be applied."""
        if not self.support.usable:
            return [f"cgroup limits not applied: {self.support.reason or 'no cgroup support'}"]
        notes: list[str] = []
        try:
            if self.support.version == "v2":
                notes += self._apply_v2(group, pid, cpu, memory)
            else:
                notes += self._apply_v1(group, pid, cpu, memory, cpus, mems)
        except OSError as exc:
            notes.append(f"cgroup {self.support.version} {group}: {_why(exc)}")
        return notes

    def _apply_v2(self, group: str, pid: int, cpu: float | None, memory: int | None) -> list[str]:
        base = self.support.bases["unified"]
        top = base / self.prefix
        top.mkdir(exist_ok=True)
        notes: list[str] = []
        for parent in (base, top):
            try:
                (parent / "cgroup.subtree_control").write_text("+cpu +memory")
            except OSError as exc:
                if parent is base:
                    return [
                        (f"cgroup v2: cannot enable cpu/memory controllers under {base} ({_why(exc)}); "
                        "a v2 parent holding processes cannot delegate: run under a delegated "
                        "systemd scope (systemd-run --scope -p Delegate=yes)")
                    ]
                raise
        d = top / group
        d.mkdir(exist_ok=True)
        (d / "cpu.max").write_text(quota_v2(cpu) if cpu else f"max {CFS_PERIOD_US}")
        if memory is not None:
            (d / "memory.max").write_text(str(memory))
        (d / "cgroup.procs").write_text(str(pid))
        return notes

    def _apply_v1(
        self, group: str, pid: int, cpu: float | None, memory: int | None,
        cpus: tuple[int, ...] | None, mems: int | None,
    ) -> list[str]:
        notes = []
        dirs = self._dirs(group)
        for ctrl, d in dirs.items():
            if ctrl == "cpuset" and not (cpus or mems is not None) and not d.is_dir():
                continue  # cpuset only for memory-node binding; reset it once it was used
            try:
                d.parent.mkdir(exist_ok=True)
                if ctrl == "cpuset":
                    _init_cpuset(d.parent)
                d.mkdir(exist_ok=True)
                if ctrl == "cpu":
                    quota, period = quota_v1(cpu) if cpu else (-1, CFS_PERIOD_US)
                    (d / "cpu.cfs_period_us").write_text(str(period))
                    (d / "cpu.cfs_quota_us").write_text(str(quota))
                elif ctrl == "memory":
                    (d / "memory.limit_in_bytes").write_text(str(memory) if memory is not None else "-1")
                elif ctrl == "cpuset":
                    parent_cpus = (d.parent / "cpuset.cpus").read_text().strip()
                    (d / "cpuset.cpus").write_text(format_cpu_list(cpus) if cpus else parent_cpus)
                    parent_mems = (d.parent / "cpuset.mems").read_text().strip()
                    (d / "cpuset.mems").write_text(str(mems) if mems is not None else parent_mems)
                (d / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                notes.append(f"cgroup v1 {ctrl} {group}: {_why(exc)}")
        if "memory" not in dirs and memory is not None:
            notes.append("cgroup v1: no memory controller mounted; memory limit not applied")
        if "cpu" not in dirs and cpu is not None:
            notes.append("cgroup v1: no cpu controller mounted; cpu quota not applied")
        return notes

    def read(self, group: str) -> Limits:
        """Limits as the kernel holds them now (None where unlimited / not readable)."""
        if self.support.version == "none":
            return Limits()
        dirs = self._dirs(group)
        try:
            if self.support.version == "v2":
                d = dirs["unified"]
                mem = (d / "memory.max").read_text().strip()
                return Limits(
                    cpu_quota=parse_cpu_max((d / "cpu.max").read_text()),
                    memory_limit=None if mem == "max" else int(mem),
                )
            quota = period = mem_v = None
            cpus = None
            if "cpu" in dirs and dirs["cpu"].is_dir():
                quota = int((dirs["cpu"] / "cpu.cfs_quota_us").read_text())
                period = int((dirs["cpu"] / "cpu.cfs_period_us").read_text())
            if "memory" in dirs and dirs["memory"].is_dir():
                mem_v = int((dirs["memory"] / "memory.limit_in_bytes").read_text())
            if "cpuset" in dirs and dirs["cpuset"].is_dir():
                cpus = (dirs["cpuset"] / "cpuset.cpus").read_text().strip() or None
            return Limits(
                cpu_quota=quota / period if quota is not None and period and quota > 0 else None,
                memory_limit=mem_v if mem_v is not None and mem_v < _V1_UNLIMITED else None,
                cpus=cpus,
            )
        except (OSError, ValueError):
            return Limits()

    def remove(self, group: str) -> None:
        """Remove the group (its processes must have exited); silent when it does not exist."""
        for d in self._dirs(group).values():
            try:
                d.rmdir()
            except OSError:
                pass


    def sweep_dead(self, alive: Callable[[int], bool]) -> list[Path]:
        """Remove the empty groups other platforms left under `scanflow-<pid>` prefixes whose process is
        gone (a platform killed before its close(), a replica whose group outlived it). Only rmdir: a
        group that still holds a process (an adopted replica) stays, and so does its prefix. Returns what
        was removed."""
        removed: list[Path] = []
        head = self.prefix.rsplit("-", 1)[0] + "-"
        for base in self.support.bases.values():
            try:
                tops = [d for d in base.iterdir() if d.is_dir() and d.name.startswith(head)]
            except OSError:
                continue
            for top in tops:
                pid = top.name[len(head):]
                if top.name == self.prefix or not pid.isdigit() or alive(int(pid)):
                    continue
                for d in [d for d in top.iterdir() if d.is_dir()]:
                    try:
                        d.rmdir()
                        removed.append(d)
                    except OSError:
                        pass
                try:
                    top.rmdir()
                    removed.append(top)
                except OSError:
                    pass
        return removed

    def remove_all(self) -> None:
        """Remove every group under our prefix, then the prefix (platform shutdown)."""
        for base in self.support.bases.values():
            top = base / self.prefix
            if not top.is_dir():
                continue
            for d in top.iterdir():
                if d.is_dir():
                    try:
                        d.rmdir()
                    except OSError:
                        pass
            try:
                top.rmdir()
            except OSError:
                pass


def _init_cpuset(d: Path) -> None:
    """A v1 cpuset group is unusable until cpus and mems are set: copy them from its parent."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        f = d / name
        if not f.read_text().strip():
            f.write_text((d.parent / name).read_text().strip())


def _why(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied ({'not root' if os.geteuid() != 0 else 'refused by the kernel'})"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.EBUSY:
        return "busy (a v2 group holding processes cannot enable controllers for children)"
    if exc.errno == errno.ENOENT:
        return f"missing file {exc.filename} (controller not enabled here)"
    return f"{exc.strerror or exc} ({exc.filename})"
