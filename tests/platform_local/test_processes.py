"""The process readings the local platform relies on (scanflow.platform.processes, through psutil), on
a real child process: its start time (the pid-reuse guard, persisted in state.json and stack.json), argv,
environment marker, threads and cores; then the same readings once it is a zombie and once it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from scanflow.platform import processes as procs

pytestmark = pytest.mark.integration

MARKER = "SCANFLOW_TEST_PROCESSES_MARKER"
# waits for its stdin to close; says "ready" first, so the test awaits that line instead of sleeping
SLEEPER = "import sys\nprint('ready', flush=True)\nsys.stdin.read()\n"


@pytest.fixture
def child(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """`python -m sleeper_mod` with MARKER=<tmp_path> in its environment, running and ready."""
    (tmp_path / "sleeper_mod.py").write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "sleeper_mod"], cwd=tmp_path, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, MARKER: str(tmp_path)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def _psutil_seconds_since_boot(pid: int) -> float:
    """The same start as psutil tells it (seconds since the epoch, less the boot time): a second opinion."""
    return float(psutil.Process(pid).create_time() - psutil.boot_time())


def test_a_live_child_reads_as_itself(child: subprocess.Popen[str], tmp_path: Path) -> None:
    start = procs.start_time(child.pid)
    assert start is not None and procs.same_process(child.pid, start)
    # clock ticks since boot, the unit state files hold: psutil agrees to within a tick or two
    assert abs(start / os.sysconf("SC_CLK_TCK") - _psutil_seconds_since_boot(child.pid)) < 0.05
    assert not procs.same_process(child.pid, start + 1)  # the same pid, another (later) process
    assert procs.Adopted(child.pid, start + 1).poll() == -1
    assert procs.Adopted(child.pid, start).poll() is None
    assert procs.cmdline(child.pid) == [sys.executable, "-m", "sleeper_mod"]
    assert procs.find_processes(MARKER, str(tmp_path), ("sleeper_mod",)) == [child.pid]
    assert procs.find_processes(MARKER, str(tmp_path), ("sleeper_mod",), exclude={child.pid}) == []
    assert procs.find_processes(MARKER, str(tmp_path / "other"), ("sleeper_mod",)) == []
    assert procs.find_processes(MARKER, str(tmp_path), ("other_mod",)) == []


def test_threads_and_cores_are_read_and_pinned(child: subprocess.Popen[str]) -> None:
    info = procs.read_proc_status(child.pid)
    assert info is not None and info.threads >= 1 and info.rss_bytes and info.cpus
    one = (min(os.sched_getaffinity(child.pid)),)
    procs.set_affinity_all_threads(child.pid, one)
    info = procs.read_proc_status(child.pid)
    assert info is not None and info.cpus == one


def test_a_zombie_and_a_gone_process_read_as_gone(child: subprocess.Popen[str], tmp_path: Path) -> None:
    pid = child.pid
    child.kill()
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie until wait()
    assert procs.start_time(pid) is None and procs.cmdline(pid) == []
    assert procs.find_processes(MARKER, str(tmp_path), ("sleeper_mod",)) == []
    child.wait(10)
    assert procs.start_time(pid) is None and procs.cmdline(pid) == [] and procs.read_proc_status(pid) is None
    assert procs.kill_groups([pid], timeout_s=1.0) == []
    with pytest.raises(ProcessLookupError):
        procs.set_affinity_all_threads(pid, (0,))
    assert procs.start_time(0) is None and procs.start_time(-1) is None and procs.cmdline(-1) == []
