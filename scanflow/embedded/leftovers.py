"""Find and stop processes a killed Executor left behind (its services and jobs run in own sessions).

The local platform starts gateways, replicas and jobs with `start_new_session`, so a SIGKILLed
Executor leaves them running, still holding the services' fixed ports. A restarted Executor (and the
stack when it stops) calls `kill_leftovers(home)`: every process of ours whose environment carries
SCANFLOW_HOME=<home> and whose command line runs a scanflow serving or job module is killed with its
process group. Linux /proc only; elsewhere it does nothing and says so.
Who calls: agents/executor.py at startup, scanflow.embedded.stack on exit.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

MODULES = ("scanflow.serving.gateway", "scanflow.serving.replica", "scanflow.platform.jobrunner")


def matches(cmdline: bytes, environ: bytes, home: str) -> bool:
    """Pure: is this process (its /proc cmdline and environ, NUL-separated) one of ours for `home`?"""
    args = cmdline.split(b"\0")
    runs_ours = any(m.encode() in args for m in MODULES)
    return runs_ours and f"SCANFLOW_HOME={home}".encode() in environ.split(b"\0")


def find_leftovers(home: str | Path, exclude: set[int] | None = None) -> list[int]:
    """Pids of our serving/job processes started with SCANFLOW_HOME=home."""
    proc = Path("/proc")
    if not proc.is_dir():
        log.warning("no /proc here: leftover processes of a killed Executor cannot be found")
        return []
    home_s = str(Path(home).resolve())
    skip = (exclude or set()) | {os.getpid()}
    out = []
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) in skip:
            continue
        try:
            if matches((d / "cmdline").read_bytes(), (d / "environ").read_bytes(), home_s):
                out.append(int(d.name))
        except OSError:  # gone, or not ours
            continue
    return out


def kill_leftovers(home: str | Path, timeout_s: float = 5.0) -> list[int]:
    """SIGKILL the process groups of our leftovers for `home`, wait until gone; returns their pids."""
    pids = killed = find_leftovers(home)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        time.sleep(0.05)
    if pids:
        log.warning("leftover processes still alive after %.0fs: %s", timeout_s, pids)
    return killed


def _zombie(pid: int) -> bool:
    try:
        return " Z " in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except OSError:
        return True
