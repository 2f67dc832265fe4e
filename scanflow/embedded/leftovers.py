"""Find and stop processes a killed Executor left behind that its new platform did not adopt.

The local platform starts gateways, replicas and jobs with `start_new_session`, so a SIGKILLed
Executor leaves them running. A restarted Executor does not come here: its LocalPlatform adopts the
services (they keep serving) and kills the rest itself (LocalPlatform.adopt). What remains for this
module is the stack's stop: every process of ours whose environment carries SCANFLOW_HOME=<home>
and whose command line runs a scanflow serving or job module is killed with its process group,
so a stack whose Executor was SIGKILLed leaves nothing behind. Linux /proc only; elsewhere it does
nothing and says so. Who calls: scanflow.embedded.stack on exit, scanflow.demo.s4_failover.
"""

from __future__ import annotations

import logging
from pathlib import Path

from scanflow.platform import processes as procs

log = logging.getLogger(__name__)

MODULES = ("scanflow.serving.gateway", "scanflow.serving.replica", "scanflow.platform.jobrunner")


def find_leftovers(home: str | Path, exclude: set[int] | None = None) -> list[int]:
    """Pids of our serving/job processes started with SCANFLOW_HOME=home (less `exclude`)."""
    if not Path("/proc").is_dir():
        log.warning("no /proc here: leftover processes of a killed Executor cannot be found")
        return []
    return procs.find_processes("SCANFLOW_HOME", str(Path(home).resolve()), MODULES, exclude)


def kill_leftovers(home: str | Path, timeout_s: float = 5.0, exclude: set[int] | None = None) -> list[int]:
    """SIGKILL the process groups of our leftovers for `home` (not `exclude`), wait until gone;
    returns their pids."""
    killed = find_leftovers(home, exclude)
    left = procs.kill_groups(killed, timeout_s)
    if left:
        log.warning("leftover processes still alive after %.0fs: %s", timeout_s, left)
    return killed
