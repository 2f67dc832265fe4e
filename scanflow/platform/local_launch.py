"""How the local platform starts its processes and places them on this machine's cores.

`Launcher` builds a child's command line and environment (its own credentials only, plus the
platform home marker the sweep in `LocalPlatform.adopt` looks for), starts gateways and replicas on
sockets reserved for them, and applies a replica's placement: cgroup limits, then affinity on every
thread. It is separate from `LocalPlatform` (which decides *what* runs) and from the supervisor (which
decides *when* to restart): both start processes the same way through it, and it holds no service
state and takes no lock.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path

import psutil

from scanflow.credentials import ChildKind, child_env, replica_record_key
from scanflow.handoff import listen_host, take_reserved_ports
from scanflow.platform import processes as procs
from scanflow.platform.base import PlatformError
from scanflow.platform.cgroups import CgroupManager, CgroupSupport
from scanflow.platform.local_state import _Replica, _Service
from scanflow.platform.topology import Placement, Topology, place_replicas
from scanflow.spec import Service

log = logging.getLogger(__name__)

MODULES = ("scanflow.serving.gateway", "scanflow.serving.replica", "scanflow.platform.jobrunner")
HOME_ENV = "SCANFLOW_PLATFORM_HOME"  # marks every process a platform starts, for the sweep in adopt()


def default_threads(spec: Service, placement: Placement, total_cores: int) -> int:
    """Thread pool = the cores a replica got (explicit `threads` wins): pinned -> its cores,
    unpinned -> ceil(cpu quota) capped by the machine."""
    if spec.threads:
        return spec.threads
    if spec.affinity.policy != "none":
        return len(placement.cpus)
    return max(1, min(total_cores, math.ceil(spec.resources.cpu)))


class Launcher:
    """Starts and places the platform's gateway and replica processes. `cg` is the cgroup manager the
    replicas' limits go through (adoption swaps in the predecessor's, whose cgroups it then owns)."""

    def __init__(
        self, home: Path, tracking_uri: str, tracker_url: str | None, token: str | None,
        allow_anonymous: bool, python: str, topology: Topology, cgroups: CgroupSupport,
    ) -> None:
        self.home = home
        self.tracking_uri = tracking_uri
        self.tracker_url = tracker_url
        self._token = token
        self.allow_anonymous = allow_anonymous
        self.python = python
        self.topology = topology
        self.cg = CgroupManager(cgroups, prefix=f"scanflow-{os.getpid()}")
        if cgroups.usable:  # what killed predecessors left (their close() never ran): empty groups only
            self.cg.sweep_dead(psutil.pid_exists)
        self.handed = take_reserved_ports()  # gateway ports reserved by who started this process

    def env(self, kind: ChildKind) -> dict[str, str]:
        """A child's environment: this process's, minus its credentials, plus the child's own
        (scanflow.credentials: a replica never holds the Executor's token or MLflow login)."""
        parent = dict(os.environ)
        if self._token:
            parent["SCANFLOW_TOKEN"] = self._token
        env = child_env(parent, kind)
        env["MLFLOW_TRACKING_URI"] = self.tracking_uri
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[HOME_ENV] = str(self.home.resolve())
        return env

    def placement(self, spec: Service, rid: int) -> Placement:
        each = max(1, math.ceil(spec.resources.cpu))
        return place_replicas(self.topology, rid, each, spec.affinity.policy)[-1]

    def spawn_replica(self, svc: _Service, rid: int, restarts: int = 0) -> _Replica:
        spec = svc.spec
        listener = procs.reserve_port("127.0.0.1")  # handed to the replica: no one takes it before it listens
        port = int(listener.getsockname()[1])
        threads = default_threads(spec, self.placement(spec, rid), self.topology.total)
        argv = [
            self.python, "-m", "scanflow.serving.replica", "--model-uri", spec.model_uri,
            "--port", str(port), "--host", "127.0.0.1", "--threads", str(threads),
            "--max-batch-size", str(spec.max_batch_size), "--max-batch-wait-ms", str(spec.max_batch_wait_ms),
            "--service", spec.name, "--replica-id", f"{spec.name}-{rid}",
        ]
        if self.tracker_url:  # the spool outlives the process: a restarted replica sends what it owed
            argv += ["--tracker-url", self.tracker_url, "--spool-dir", str(self.home / "spool" / f"{spec.name}-{rid}")]
        if self.allow_anonymous:
            argv.append("--allow-anonymous")
        log_path = self.home / "logs" / f"{spec.name}-{rid}.log"
        env = self.env("replica") | replica_record_key(os.environ, spec.name)  # ids bound to its service
        proc = procs.spawn(argv, log_path, env, listener=listener)
        log.info("service %s: replica %d starting (pid %d, port %d)", spec.name, rid, proc.pid, port)
        return _Replica(rid=rid, port=port, proc=proc, restarts=restarts)

    def gateway_listener(self, port: int | None) -> socket.socket:
        """The socket a gateway is to serve on: the reservation handed to this process for `port` (an
        embedded stack fixes gateway ports before its Executor starts), else one made now, on `port`
        (a spec's, or the one a restarted gateway keeps) or a free one."""
        if port and port in self.handed:
            return self.handed.pop(port)
        try:
            return procs.reserve_port(listen_host(self.env("gateway")), port)
        except procs.PortInUse as exc:
            raise PlatformError(f"gateway: {exc.strerror}", retryable=True) from None

    def spawn_gateway(self, spec: Service, listener: socket.socket, backup_url: str | None) -> procs.Proc:
        """Start the gateway on `listener` (a `gateway_listener`), which it takes over."""
        argv = [
            self.python, "-m", "scanflow.serving.gateway", "--port", str(listener.getsockname()[1]),
            "--service", spec.name, "--health-interval-s", "0.5",
        ]
        if backup_url:
            argv += ["--backup", backup_url]
        if self.allow_anonymous:
            argv.append("--allow-anonymous")
        return procs.spawn(argv, self.home / "logs" / f"{spec.name}-gateway.log", self.env("gateway"),
                           listener=listener)

    def apply_to_replica(self, svc: _Service, rep: _Replica) -> list[str]:
        """cgroup limits, then affinity (moving into a cpuset resets affinity), for one replica."""
        spec = svc.spec
        place = self.placement(spec, rep.rid)
        numa = spec.affinity.policy == "numa"
        notes = self.cg.apply(
            f"{spec.name}-{rep.rid}", rep.proc.pid, cpu=spec.resources.cpu,
            memory=spec.resources.memory_bytes,
            cpus=place.cpus if numa else None, mems=place.node if numa else None,
        )
        try:
            procs.set_affinity_all_threads(rep.proc.pid, place.cpus)
        except (ProcessLookupError, OSError) as exc:
            notes.append(f"replica {rep.rid}: affinity not applied: {exc}")
        if place.shared:
            notes.append(f"replica {rep.rid}: not enough cores for exclusive placement; cores are shared")
        return notes

    def close(self) -> None:
        """Close the gateway ports handed to this process that no gateway took."""
        for sock in self.handed.values():
            sock.close()
        self.handed.clear()
