"""What a replica reads about its own CPU: cgroup cpu.stat (v1, v2) -> throttling, /proc/stat -> the node's
CPUs and idle seconds, and the series it exports on /metrics, from a fake /proc and cgroup tree."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from scanflow.agentkit import observe
from scanflow.serving.cpustat import CpuCollector, CpuStatReader, Throttling, parse_cpu_stat, parse_proc_stat

V2 = "usage_usec 5000000\nuser_usec 4000000\nsystem_usec 1000000\nnr_periods 120\nnr_throttled 30\nthrottled_usec 2500000\n"
V1 = "nr_periods 200\nnr_throttled 50\nthrottled_time 1500000000\n"
STAT = ("cpu  100 0 50 1000 200 0 0 0 0 0\ncpu0 50 0 25 500 100 0 0 0 0 0\ncpu1 50 0 25 500 100 0 0 0 0 0\n"
        "intr 1 2 3\nctxt 99\n")


def test_cpu_stat_v1_and_v2() -> None:
    assert parse_cpu_stat(V2) == Throttling(120, 30, 2.5)
    assert parse_cpu_stat(V1) == Throttling(200, 50, 1.5)
    assert parse_cpu_stat("usage_usec 10\n") is None  # no CFS bandwidth figures (no cpu controller)
    assert parse_cpu_stat("") is None


def test_proc_stat_gives_node_cpus_and_idle_seconds() -> None:
    assert parse_proc_stat(STAT, clk_tck=100) == (2, 12.0)  # (idle 1000 + iowait 200) / 100
    assert parse_proc_stat("intr 1\n") is None


def _fake(tmp_path: Path, stat_text: str | None) -> Path:
    root = tmp_path / "cg2"
    grp = root / "scanflow/r1"
    grp.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (grp / "cpu.max").write_text("50000 100000\n")
    if stat_text is not None:
        (grp / "cpu.stat").write_text(stat_text)
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "self/mounts").write_text(f"cgroup2 {root} cgroup2 rw 0 0\n")
    (proc / "self/cgroup").write_text("0::/scanflow/r1\n")
    (proc / "stat").write_text(STAT)
    (proc / "sys/kernel/random/boot_id").write_text("node-a\n")
    return proc


def test_exported_series_parse_back_as_the_checker_reads_them(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    reg.register(CpuCollector(CpuStatReader(_fake(tmp_path, V2))))
    s = observe.parse_replica(generate_latest(reg).decode())
    assert s.limit_cores == 0.5  # the quota of its own group, under the CPUs it may run on
    assert (s.periods, s.throttled_periods) == (120, 30)
    assert s.node_cpus == 2 and s.node == "node-a" and s.node_idle_s is not None
    assert s.cpu_s is not None and s.cpu_s > 0  # this test process's own CPU time
    assert s.requests == 0 and s.model_s == 0  # a replica that served nothing yet: zero, not unknown


def test_unreadable_files_leave_their_series_out(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    reg.register(CpuCollector(CpuStatReader(_fake(tmp_path, None))))
    text = generate_latest(reg).decode()
    assert "scanflow_replica_cpu_throttled_periods_total" not in text  # no cpu.stat: unknown, never 0
    assert "scanflow_replica_cpu_seconds_total" in text and "scanflow_replica_cpu_limit_cores 0.5" in text
