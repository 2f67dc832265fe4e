"""What a replica can measure about its own CPU: used, limit, throttling, and its node's idle cores.

Why: the Planner's scaling and resources decisions must come from observations, not from a model of
the machine. Each replica reads ITS OWN process and cgroup, so the same code answers on a laptop
(LocalPlatform puts each replica in its own group), in compose and in a Kubernetes pod (the
container's cgroup is the pod's limit). The replica exports the figures on /metrics as counters and
gauges (`CpuCollector`); the Checker turns two scrapes into rates (scanflow.agentkit.observe).

Pure parts (tested without a cgroup): `parse_cpu_stat` (v1 and v2 cpu.stat text -> periods,
throttled periods, throttled seconds) and `parse_proc_stat` (/proc/stat -> node CPUs, idle seconds).
`CpuStatReader` only reads files; every unreadable file leaves its series out (never raises).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scanflow.platform.cgroups import detect_from
from scanflow.serving.cpuwatch import CpuLimitReader

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Throttling:
    """Cumulative CFS bandwidth figures of one cgroup."""

    periods: int
    throttled_periods: int
    throttled_s: float


def parse_cpu_stat(text: str) -> Throttling | None:
    """cgroup cpu.stat -> Throttling. v2 names throttled time `throttled_usec`, v1 `throttled_time` (ns).
    None when the text has no `nr_periods` (no CPU controller figures)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            fields[parts[0]] = int(parts[1])
    if "nr_periods" not in fields:
        return None
    if "throttled_usec" in fields:
        seconds = fields["throttled_usec"] / 1e6
    else:
        seconds = fields.get("throttled_time", 0) / 1e9
    return Throttling(fields["nr_periods"], fields.get("nr_throttled", 0), seconds)


def parse_proc_stat(text: str, clk_tck: int = _CLK_TCK) -> tuple[int, float] | None:
    """/proc/stat -> (CPUs on the node, idle+iowait seconds summed over them). None when unreadable."""
    cpus = 0
    idle: float | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "cpu" and len(parts) >= 6:
            idle = (int(parts[4]) + int(parts[5])) / clk_tck
        elif parts[0].startswith("cpu") and parts[0][3:].isdigit():
            cpus += 1
    if idle is None or cpus == 0:
        return None
    return cpus, idle


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class CpuStatReader:
    """Reads this process's cgroup cpu.stat (throttling) and the node's /proc/stat.

    `proc` is /proc by default; tests pass a fake directory (self/mounts, self/cgroup, stat).
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self.limits = CpuLimitReader(proc)
        self._mounts = _read(proc / "self/mounts") or ""

    def cpu_stat_path(self) -> Path | None:
        """This process's own group's cpu.stat (v2 unified, v1 the cpu controller's group)."""
        self_cg = _read(self.proc / "self/cgroup")
        if self_cg is None:
            return None
        sup = detect_from(self._mounts, self_cg, self.limits._v2_controllers)
        base = sup.bases.get("unified") if sup.version == "v2" else sup.bases.get("cpu")
        return None if base is None else base / "cpu.stat"

    def throttling(self) -> Throttling | None:
        path = self.cpu_stat_path()
        text = None if path is None else _read(path)
        return None if text is None else parse_cpu_stat(text)

    def node(self) -> tuple[int, float] | None:
        text = _read(self.proc / "stat")
        return None if text is None else parse_proc_stat(text)

    def node_id(self) -> str | None:
        """The kernel's boot id: the same for every process (and container) of one node, so the Checker
        can tell which replicas share a node's idle cores."""
        text = _read(self.proc / "sys/kernel/random/boot_id")
        return text.strip() or None if text is not None else None


def allowed_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class CpuCollector(Collector):
    """The replica's CPU series, read at scrape time (a handful of small file reads per scrape)."""

    def __init__(self, reader: CpuStatReader | None = None) -> None:
        self.reader = reader or CpuStatReader()

    def collect(self) -> Iterator[Metric]:
        t = os.times()
        cpu = CounterMetricFamily("scanflow_replica_cpu_seconds", "this process's CPU time (user+system)")
        cpu.add_metric([], t.user + t.system)
        yield cpu
        allowed = allowed_cpus()
        g = GaugeMetricFamily("scanflow_replica_cpus_allowed", "CPUs in this replica's affinity mask")
        g.add_metric([], allowed)
        yield g
        try:
            quota = self.reader.limits.read()
        except Exception:  # noqa: BLE001 - a surprise in /proc must never break a scrape
            quota = None
        lim = GaugeMetricFamily("scanflow_replica_cpu_limit_cores",
                                "cores this replica may use: min(cgroup quota, CPUs allowed)")
        lim.add_metric([], allowed if quota is None else min(quota, allowed))
        yield lim
        th = self.reader.throttling()
        if th is not None:
            for name, doc, value in (
                ("scanflow_replica_cpu_periods", "CFS periods of this replica's cgroup", th.periods),
                ("scanflow_replica_cpu_throttled_periods", "CFS periods in which it was throttled",
                 th.throttled_periods),
                ("scanflow_replica_cpu_throttled_seconds", "time its cgroup was throttled", th.throttled_s),
            ):
                c = CounterMetricFamily(name, doc)
                c.add_metric([], value)
                yield c
        node = self.reader.node()
        if node is not None:
            n = GaugeMetricFamily("scanflow_replica_node_cpus", "CPUs of the node this replica runs on")
            n.add_metric([], node[0])
            yield n
            idle = CounterMetricFamily("scanflow_replica_node_cpu_idle_seconds",
                                       "idle+iowait seconds of the node, summed over its CPUs")
            idle.add_metric([], node[1])
            yield idle
        node_id = self.reader.node_id()
        if node_id is not None:
            info = GaugeMetricFamily("scanflow_replica_node_info", "1, labelled with the node's boot id",
                                     labels=["node"])
            info.add_metric([node_id], 1)
            yield info
        now = GaugeMetricFamily("scanflow_replica_scrape_time_seconds", "the replica's clock at this scrape")
        now.add_metric([], time.time())
        yield now
