"""The local platform's records of its services and their state file, which lets a successor adopt them.

`_Service` and `_Replica` are what LocalPlatform keeps per service; `snapshot` turns them into the JSON
written to <home>/state.json (`write_state`: temp file + os.replace, so a reader never sees half a file),
`read_state` reads it back for `LocalPlatform.adopt`, and `take_over` decides whether a recorded process
is still the one recorded (same pid, start time, module and port) before it is adopted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scanflow.platform import processes as procs
from scanflow.spec import Service

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
STATE_VERSION = 1


@dataclass
class _Replica:
    rid: int  # 1-based slot: decides its cores under CPUMEM
    port: int
    proc: procs.Proc
    state: Literal["starting", "ready", "dead"] = "starting"
    started_at: float = field(default_factory=time.monotonic)
    restarts: int = 0
    restart_at: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class _Service:
    spec: Service
    gateway: procs.Proc
    gateway_port: int
    replicas: dict[int, _Replica] = field(default_factory=dict)
    registered: tuple[str, ...] | None = None  # replica URLs the gateway holds (None = unknown)
    backup_url: str | None = None
    routed_to: str | None = None
    notes: dict[str, str] = field(default_factory=dict)  # topic -> note (latest wins)
    # held across one replica-list update of this gateway (compute, PUT, record), so the list sent
    # last is the one computed last; taken before the platform's _lock, never inside it
    gateway_io: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    supervisor: threading.Thread | None = field(default=None, repr=False, compare=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"


@dataclass(frozen=True)
class _Observed:
    """What one supervisor tick must probe, snapshotted under the lock (probed outside it)."""

    gateway: procs.Proc  # the gateway process the probe is about (a restart makes a new one)
    endpoint: str
    probe_gateway: bool  # the gateway's state is unknown: ask its /health before re-feeding it
    starting: tuple[_Replica, ...]  # replicas whose /ready to ask


_Taken = tuple[dict[str, Any], "procs.Adopted | None", bool]  # adopt(): (record, process if it is still it, ready)


def snapshot(services: dict[str, _Service], start_of: Callable[[procs.Proc], int | None],
             cpus_of: Callable[[_Service, int], Sequence[int]], cgroup_prefix: str) -> dict[str, Any]:
    """Pure given its callables: everything a successor needs to take the services over (the caller
    holds the platform's lock)."""
    out = {}
    for name, svc in services.items():
        out[name] = {
            "spec": svc.spec.model_dump(mode="json"),
            "gateway": {"pid": svc.gateway.pid, "start": start_of(svc.gateway), "port": svc.gateway_port},
            "backup_url": svc.backup_url,
            "routed_to": svc.routed_to,
            "replicas": [
                {"rid": r.rid, "pid": r.proc.pid, "start": start_of(r.proc), "port": r.port,
                 "restarts": r.restarts, "cpus": list(cpus_of(svc, r.rid))}
                for r in sorted(svc.replicas.values(), key=lambda r: r.rid)
            ],
        }
    return {"version": STATE_VERSION, "cgroup_prefix": cgroup_prefix, "services": out}


def write_state(path: Path, text: str) -> bool:
    """Write the state atomically (temp file + os.replace). False, with a warning, when it could not be
    written: that costs adoption after a crash, not the running services."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("platform state not written to %s: %s", path, exc)
        return False
    return True


def read_state(path: Path) -> dict[str, Any]:
    """The state a predecessor wrote; {} (adopt nothing) when there is none, or it is unreadable or of
    an unknown version (with a warning)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        log.warning("platform state %s unreadable (%s): adopting nothing", path, exc)
        return {}
    if not isinstance(data, dict):
        log.warning("platform state %s is not an object: adopting nothing", path)
        return {}
    if data.get("version") not in (None, STATE_VERSION):
        log.warning("platform state version %s unknown: adopting nothing", data.get("version"))
        return {}
    return data


def take_over(rec: dict[str, Any], module: str, probe: str) -> tuple[procs.Adopted | None, bool]:
    """(process, answers probe) for a recorded process that is still the one recorded: same pid
    and start time, running `module` on the recorded port. (None, False) otherwise."""
    pid, start, port = rec.get("pid"), rec.get("start"), rec.get("port")
    if not isinstance(pid, int) or not isinstance(start, int) or not isinstance(port, int):
        return None, False
    if not procs.same_process(pid, start):
        return None, False
    argv = procs.cmdline(pid)
    if module not in argv or f"--port {port}" not in " ".join(argv):
        return None, False  # a pid reused within the same clock tick, or not ours
    return procs.Adopted(pid, start), procs.is_ready(f"http://127.0.0.1:{port}{probe}", 2.0)
