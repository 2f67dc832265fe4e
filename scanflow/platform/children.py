"""Stop every process this one started, however this one ends (normal exit, an exception, SIGINT,
SIGTERM, SIGHUP): benchmarks and scripts that start servers (MLflow, replicas, gateways, peers) call
`stop_children_on_exit()` first.

Why: the servers run in their own sessions (so a stop reaches their workers), which also means a
signal to the parent's group never reaches them, and SIGTERM's default action ends Python without
running any `finally` or `with` exit. Here SIGTERM and SIGHUP raise SystemExit in the main thread, so
every context manager stops its server as on a normal exit, and an atexit sweep then stops whatever
descendant is still running (a process nobody wrapped, a server's own workers). The process is made a
child subreaper (Linux) so that an orphaned grandchild is still found among its descendants.
A SIGKILL of the parent cannot be caught: that case is left to `scanflow.embedded.leftovers`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import time
from collections.abc import Iterable
from types import FrameType

import psutil

from scanflow.platform.processes import start_time

PR_SET_CHILD_SUBREAPER = 36
_installed = False


def descendants(root: int | None = None) -> list[int]:
    """Live pids below `root` (default: this process), parents before their children; [] when `root`
    is gone. psutil's walk leaves out a process older than `root` (its parent's pid was reused) and
    stops on the cycles pid reuse can show mid-walk; zombies are listed (start_time reads them as gone)."""
    try:
        return [c.pid for c in psutil.Process(os.getpid() if root is None else root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap() -> None:
    """Collect exited children (ours, or orphans handed to us as subreaper) so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace_s: float = 10.0) -> list[int]:
    """SIGTERM every descendant, SIGKILL those still alive after `grace_s`; returns the pids that
    survived even that (none expected). The list is taken before any signal, so a grandchild whose
    parent dies first is still stopped."""
    pids = descendants()
    if not pids:
        return []
    started = {p: start_time(p) for p in pids}

    def alive() -> list[int]:
        _reap()
        return [p for p in pids if started[p] is not None and start_time(p) == started[p]]

    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.05)  # other processes' exits: nothing to await but their /proc entries
    if left:
        _signal_all(left, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while (left := alive()) and time.monotonic() < deadline:
            time.sleep(0.05)
    return left


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def stop_children_on_exit(grace_s: float = 10.0) -> None:
    """Install the handlers (idempotent; call from the main thread): SIGTERM/SIGHUP -> SystemExit, an
    atexit sweep of descendants, and child-subreaper status where the kernel has it."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init, the sweep misses only those
        pass
    atexit.register(stop_descendants, grace_s)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
