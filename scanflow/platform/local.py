"""The embedded default platform: services and jobs as OS processes on this machine.

A service = one gateway process (its endpoint) + N replica processes (scanflow.serving.replica /
.gateway, started with `python -m`). Replicas join the gateway only once /ready answers, leave it
before they are drained and stopped, and a supervisor thread restarts any that die (with backoff), so
scaling and crashes cost no failed request the gateway could avoid. CPU placement follows the
machine's topology (topology.place_replicas: ANY or the paper's CPUMEM), applied with
sched_setaffinity on every thread; CPU quota and memory limit go through cgroups (cgroups.py) where
the OS allows, else a note says why (local_launch.py starts and places every process). Jobs run as
child processes inside an MLflow run (jobrunner.py).

Restart: the platform writes its state (per service: spec, gateway and replicas' pids, start
times, ports, slots, cores, backup, route) to <home>/state.json after every change (temp file +
os.replace). A new LocalPlatform on the same home calls `adopt()`: each recorded process that is
still the same process (pid + start time + command line) is taken over and watched by pid, dead
ones are restarted, and anything else this home's platform left running is killed (local_adopt.py).
So a SIGKILLed owner (the Executor) costs no downtime: the services never stopped.

Concurrency: `_lock` guards the in-memory state and is never held across an HTTP request to a
gateway or replica (up to 15 s x 4 attempts each, or a 1 s probe): callers snapshot their targets
under it, call outside it, and re-take it to record the results, re-checking that the service and
replica are still the ones they snapshotted (a replica retired or a service deleted meanwhile is
left alone). So status() and the public calls answer while a gateway or replica is slow. Each
service has its own supervisor thread (observe -> probe -> promote -> update the gateway:
local_supervisor.py), so one service's slow probe never delays another's crash restarts. `_changes`
serialises the public calls that change a service (scale, set_resources, route); a service's
`gateway_io` serialises updates of its gateway's replica list, so the list sent last is the one
computed last. Lock order: `_changes` -> `gateway_io` -> `_lock`. Methods block: async callers use
asyncio.to_thread.
Who calls: the Executor agent's actuators, `scanflow deploy`, the demo, tests and benchmarks.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Self

from scanflow.auth import bearer_header
from scanflow.platform import processes as procs
from scanflow.platform.base import (
    JobResult,
    PlatformError,
    ReplicaStatus,
    ResourceChange,
    ServiceStatus,
)
from scanflow.platform.cgroups import CgroupManager, CgroupSupport, detect
from scanflow.platform.jobruns import JOBS_EXPERIMENT
from scanflow.platform.local_adopt import rebuild, take_over_services
from scanflow.platform.local_jobs import run_local_job
from scanflow.platform.local_launch import HOME_ENV, MODULES, Launcher, default_threads
from scanflow.platform.local_state import STATE_FILE, _Replica, _Service, read_state, snapshot, write_state
from scanflow.platform.local_supervisor import Supervisor, send_backup
from scanflow.platform.readback import Wanted
from scanflow.platform.topology import Topology, allowed_topology
from scanflow.spec import Affinity, Job, Resources, Service

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


class LocalPlatform:
    """Platform on this machine. `close()` (also at exit) stops every process it started or adopted;
    a SIGKILLed owner leaves them running (own sessions) for the next one's `adopt()`."""

    def __init__(
        self,
        home: Path,
        tracking_uri: str,
        tracker_url: str | None = None,
        token: str | None = None,
        allow_anonymous: bool = False,
        python: str = sys.executable,
        *,
        topology: Topology | None = None,
        cgroups: CgroupSupport | None = None,
        supervise_interval_s: float = 0.25,
        experiment: str = JOBS_EXPERIMENT,
    ) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = tracking_uri
        self.tracker_url = tracker_url
        self._token = token
        self.allow_anonymous = allow_anonymous
        self.python = python
        self.topology = topology or allowed_topology()  # the cores its cpuset allows, by socket
        self.cgroup_support = cgroups or detect()
        self._launch = Launcher(self.home, tracking_uri, tracker_url, token, allow_anonymous, python,
                                self.topology, self.cgroup_support)  # starts and places the processes
        self._written = ""  # the state last written (a write happens only when it changed)
        self._starts: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()
        self.experiment = experiment
        self._services: dict[str, _Service] = {}
        self._lock = threading.RLock()  # the state; never held across a public call's HTTP requests
        self._changes = threading.RLock()  # one public change at a time; taken before _lock, never inside it
        self._closed = threading.Event()
        self._supervisor = Supervisor(self._services, self._lock, self._closed, self._launch, self._persist,
                                      bearer_header(token), supervise_interval_s)
        atexit.register(self.close)

    # -- helpers ---------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return bearer_header(self._token)

    def _get(self, name: str) -> _Service:
        svc = self._services.get(name)
        if svc is None:
            raise PlatformError(f"no service {name!r} on this platform (deployed: {sorted(self._services)})")
        return svc

    # -- state on disk, and adoption ------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.home / STATE_FILE

    def _start_of(self, proc: procs.Proc) -> int | None:
        """The process's start time (pid-reuse guard), read once per process object."""
        if isinstance(proc, procs.Adopted):
            return proc.start_time
        if proc not in self._starts:
            self._starts[proc] = procs.start_time(proc.pid)
        return self._starts[proc]

    def _snapshot(self) -> dict[str, Any]:
        """Everything a successor needs to take the services over (caller holds the lock)."""
        return snapshot(self._services, self._start_of,
                        lambda svc, rid: self._launch.placement(svc.spec, rid).cpus, self._launch.cg.prefix)

    def _persist(self) -> None:
        """Write the state (scanflow.platform.local_state.write_state) when it changed. Never raises: a
        failed write costs adoption after a crash, not the running services."""
        with self._lock:
            if self._closed.is_set():
                return
            text = json.dumps(self._snapshot(), indent=1, sort_keys=True)
            if text != self._written and write_state(self.state_path, text):
                self._written = text

    def adopt(self) -> dict[str, dict[str, Any]]:
        """Take over the services a previous platform on this home left running (it was killed).

        Per recorded service: a live gateway answering /health and live replicas (ready, or still
        starting) are kept, watched by pid; everything else this home's platforms started (dead
        entries' stragglers, processes spawned after the last state write, cut jobs) is killed;
        a missing gateway restarts on its port, missing replicas restart through the supervisor,
        and the gateway's replica list is re-sent. Call once, before any deploy.
        Returns {service: {"adopted": [pids], "restarted": [what]}}. Who calls: the Executor at startup.
        """
        with self._lock:
            if self._services:
                raise PlatformError("adopt() must come before any deploy on this platform")
            data = read_state(self.state_path)
            if data.get("cgroup_prefix"):  # the adopted replicas' cgroups: ours to remove at close()
                self._launch.cg = CgroupManager(self.cgroup_support, prefix=str(data["cgroup_prefix"]))
            found, keep = take_over_services(data)
            stray = procs.find_processes(HOME_ENV, str(self.home.resolve()), MODULES, exclude=keep)
            if stray:
                log.warning("killing %d processes a previous platform left and no one adopts: %s", len(stray), stray)
                procs.kill_groups(stray)
            report: dict[str, dict[str, Any]] = {}
            now = time.monotonic()
            for name, (spec, rec, gw, reps) in found.items():
                svc, restarted = rebuild(spec, rec, gw, reps, self._launch, now)
                self._services[name] = svc  # registered=None: the next tick re-sends the replica list
                self._supervisor.start(svc)
                report[name] = {"adopted": sorted(p.pid for p in [gw, *(x[1] for x in reps.values())] if p),
                                "restarted": restarted}
                log.info("service %s adopted: %s", name, report[name])
            self._persist()
            return report

    def services(self) -> dict[str, Service]:
        """The spec each service runs with now (after scale, swap, set_resources): what a restarted
        owner merges into its workflow's specs so deploying them again changes nothing."""
        with self._lock:
            return {name: svc.spec for name, svc in self._services.items()}

    def pids(self) -> set[int]:
        """Pids of every gateway and replica process this platform watches now."""
        with self._lock:
            return {p.pid for svc in self._services.values() for p in [svc.gateway, *(r.proc for r in svc.replicas.values())]
                    if p.poll() is None}

    # -- Platform --------------------------------------------------------------------------------
    def deploy(self, service: Service) -> ServiceStatus:
        """Create the service, or apply what changed (replicas, model, resources, backup)."""
        with self._lock:
            svc = self._services.get(service.name)
            if svc is None:
                listener = self._launch.gateway_listener(service.port)
                port = int(listener.getsockname()[1])
                backup = self._services.get(service.backup) if service.backup else None
                gateway = self._launch.spawn_gateway(service, listener, None)
                svc = _Service(spec=service, gateway=gateway, gateway_port=port)
                svc.backup_url = backup.endpoint if backup else None
                if service.backup and backup is None:
                    svc.notes["backup"] = f"backup {service.backup!r} not deployed yet; wired when it is"
                self._services[service.name] = svc
                for rid in range(1, service.replicas + 1):
                    svc.replicas[rid] = self._launch.spawn_replica(svc, rid)
                tell: list[tuple[_Service, str]] = []  # services that named this one as backup
                for other in self._services.values():
                    if other is not svc and other.spec.backup == service.name:
                        other.backup_url = svc.endpoint
                        other.notes.pop("backup", None)
                        if other.registered is not None:  # else its next re-feed sends it
                            tell.append((other, other.endpoint))
                self._persist()
                self._supervisor.start(svc)  # it re-feeds the gateway (replicas, backup) once /health answers
                new = True
            else:
                new = False
        if new:  # HTTP from here on, outside the lock
            for other, endpoint in tell:
                error = send_backup(endpoint, svc.endpoint, self._headers())
                if error is not None:
                    with self._lock:
                        other.notes["backup"] = error
            if not procs.wait_until(lambda: procs.is_ready(f"{svc.endpoint}/health", 1.0), 60.0, 0.2):
                raise PlatformError(f"service {service.name!r}: gateway not healthy within 60s", retryable=True)
            self._supervisor.wait_ready(service.name)
            self._persist()
            return self.status(service.name)
        return self._update(svc, service)

    def _update(self, svc: _Service, new: Service) -> ServiceStatus:
        old = svc.spec
        if new == old:
            return self.status(new.name)
        if new.model_uri != old.model_uri:
            self.swap_model(new.name, new.model_uri)
        if (new.resources, new.affinity, new.threads) != (old.resources, old.affinity, old.threads):
            self.set_resources(new.name, new.resources, new.affinity, new.threads)
        if new.backup != old.backup:
            with self._lock:
                target = self._services.get(new.backup) if new.backup else None
                svc.backup_url = target.endpoint if target else None
                endpoint, url = svc.endpoint, svc.backup_url
            error = send_backup(endpoint, url, self._headers())  # outside the lock: an HTTP call
            with self._lock:
                if error is not None:
                    svc.notes["backup"] = error
        if new.replicas != len(svc.replicas):
            self.scale(new.name, new.replicas)
        rest = {"max_batch_size", "max_batch_wait_ms", "port", "image"}
        changed = sorted(k for k in rest if getattr(new, k) != getattr(old, k))
        with self._lock:
            svc.spec = new
            if changed:
                svc.notes["restart"] = f"{changed} apply to replicas started from now on (scale or restart)"
        self._persist()
        return self.status(new.name)

    def scale(self, service: str, replicas: int) -> ServiceStatus:
        """Add replicas (ready before they join) or remove them (leave gateway, drain, stop)."""
        with self._changes:
            return self._scale(service, replicas)

    def _scale(self, service: str, replicas: int) -> ServiceStatus:
        with self._lock:
            svc = self._get(service)
            if not 0 <= replicas <= svc.spec.max_replicas:
                raise PlatformError(
                    f"replicas={replicas} for {service!r} must lie in [0, max_replicas={svc.spec.max_replicas}]"
                )
            current = sorted(svc.replicas)
            if replicas > len(current):
                free = [i for i in range(1, replicas + 1) if i not in svc.replicas]
                for rid in free[: replicas - len(current)]:
                    svc.replicas[rid] = self._launch.spawn_replica(svc, rid)
            victims = [svc.replicas.pop(rid) for rid in current[replicas:]] if replicas < len(current) else []
            svc.spec = svc.spec.model_copy(update={"replicas": replicas})
            self._persist()
        if victims:  # out of rotation first (every later update leaves them out too: they are popped)
            self._supervisor.sync_gateway(svc)
        for rep in victims:
            self._retire(svc, rep)
        self._supervisor.wait_ready(service)
        self._persist()
        return self.status(service)

    def _retire(self, svc: _Service, rep: _Replica) -> None:
        if rep.proc.poll() is None:
            try:
                procs.call("POST", f"{rep.url}/admin/drain", headers=self._headers(), timeout_s=30.0, retries=0)
            except procs.HttpError as exc:
                log.info("drain of replica %d failed (%s); stopping anyway", rep.rid, exc)
        procs.stop(rep.proc, STOP_GRACE_S)
        self._launch.cg.remove(f"{svc.spec.name}-{rep.rid}")

    def set_resources(
        self, service: str, resources: Resources, affinity: Affinity | None = None,
        threads: int | None = None,
    ) -> ResourceChange:
        """Re-place every replica (affinity + cgroup) and resize its thread pool to the cores it got.
        Placement is applied under the lock (local syscalls); the thread-pool requests go out after it."""
        with self._changes:
            with self._lock:
                svc = self._get(service)
                update: dict[str, Any] = {"resources": resources, "threads": threads}
                if affinity is not None:
                    update["affinity"] = affinity
                svc.spec = svc.spec.model_copy(update=update)  # replicas started from now on get it too
                notes: list[str] = []
                applied: dict[str, Any] = {}
                resize: list[tuple[int, str, int]] = []  # (rid, url, threads)
                for rep in sorted(svc.replicas.values(), key=lambda r: r.rid):
                    if rep.state != "ready":
                        continue  # it gets the new settings when it becomes ready
                    notes += self._launch.apply_to_replica(svc, rep)
                    place = self._launch.placement(svc.spec, rep.rid)
                    n = default_threads(svc.spec, place, self.topology.total)
                    resize.append((rep.rid, rep.url, n))
                    applied[f"{service}-{rep.rid}"] = {"cpus": list(place.cpus), "threads": n}
                self._persist()
            for rid, url, n in resize:
                try:
                    procs.call("POST", f"{url}/admin/threads", json={"threads": n},
                               headers=self._headers(), timeout_s=15.0)
                except procs.HttpError as exc:
                    notes.append(f"replica {rid}: thread pool not resized: {exc}")
            with self._lock:
                svc.notes = {k: v for k, v in svc.notes.items() if not k.startswith("replica-")}
                svc.notes.update({f"replica-set-{i}": n for i, n in enumerate(notes)})
                self._persist()
        applied.update({"cpu": resources.cpu, "memory": resources.memory,
                        "affinity": svc.spec.affinity.policy})
        method = "affinity+cgroup" if self.cgroup_support.usable else "affinity"
        # what the plan asked for, whether or not this machine could apply it: a refused cgroup write
        # must show as a mismatch on read-back, not as success
        wanted = Wanted(cpu_quota=resources.cpu, memory_limit=resources.memory_bytes,
                        cpus={f"{service}-{rid}": tuple(applied[f"{service}-{rid}"]["cpus"]) for rid, _, _ in resize},
                        replica_threads={f"{service}-{rid}": n for rid, _, n in resize})
        return ResourceChange(service=service, method=method, applied=applied, notes=tuple(dict.fromkeys(notes)),
                              wanted=wanted)

    def route(self, service: str, to: str | None = None) -> ServiceStatus:
        """Failover to service `to` (its gateway becomes our backup, route forced), or back to 'auto'.
        The gateway is told first (outside the lock); the state records only what it accepted."""
        with self._changes:
            with self._lock:
                svc = self._get(service)
                endpoint = svc.endpoint
                backup: str | None = None  # a new backup URL to send first
                target_url: str | None = None
                if to is not None:
                    target = self._get(to)
                    if target is svc:
                        raise PlatformError(f"cannot route {service!r} to itself; use to=None")
                    backup = target.endpoint if svc.backup_url != target.endpoint else None
                    target_url = target.endpoint
            if backup is not None:
                procs.call("PUT", f"{endpoint}/admin/backup", json={"url": backup}, headers=self._headers())
                with self._lock:
                    svc.backup_url = backup
                    self._persist()
            procs.call("PUT", f"{endpoint}/admin/route", json={"to": "auto" if to is None else "backup"},
                       headers=self._headers())
            with self._lock:
                svc.routed_to = to
                if target_url is not None:
                    svc.backup_url = target_url
                self._persist()
        return self.status(service)

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow",
                       share: float = 0.0, delivery: str | None = None) -> ServiceStatus:
        """Put the service `challenger` (its gateway) on `service`'s gateway as a progressive delivery's
        challenger, in `mode` (shadow, canary) at `share` (scanflow.serving.challenger), or take it off (None).
        Not kept in the platform's state: the Executor repeats the call while the delivery runs, which gives a
        restarted gateway its challenger back (scanflow/standard/executor_delivery.py)."""
        with self._lock:
            endpoint = self._get(service).endpoint
            target = self._get(challenger).endpoint if challenger is not None else None
        try:
            if target is None:
                procs.call("DELETE", f"{endpoint}/admin/challenger", headers=self._headers())
            else:
                procs.call("PUT", f"{endpoint}/admin/challenger", headers=self._headers(),
                           json={"url": target, "mode": mode, "share": share, "service": challenger,
                                 "delivery": delivery})
        except procs.HttpError as exc:  # a gateway restarting: the Executor repeats the call
            raise PlatformError(f"{service!r}: challenger not set on its gateway: {exc}",
                                retryable=exc.status is None or exc.status >= 500) from None
        return self.status(service)

    def swap_model(self, service: str, model_uri: str) -> ServiceStatus:
        """Hot-swap every replica, one at a time (each loads beside, switches, drains)."""
        with self._lock:
            svc = self._get(service)
            svc.spec = svc.spec.model_copy(update={"model_uri": model_uri})  # restarts use it too
            self._persist()
            targets = [r for r in svc.replicas.values() if r.state == "ready"]
        failed = []
        for rep in targets:
            try:
                procs.call("POST", f"{rep.url}/admin/model", json={"model_uri": model_uri},
                           headers=self._headers(), timeout_s=120.0, retries=1)
            except procs.HttpError as exc:
                failed.append(f"replica {rep.rid}: {exc}")
        if failed:
            raise PlatformError(f"model swap of {service!r} failed on: " + "; ".join(failed), retryable=True)
        return self.status(service)

    def status(self, service: str) -> ServiceStatus:
        """What is really applied: /proc (cores, threads), cgroup files, each replica's /info."""
        with self._lock:
            svc = self._get(service)
            reps = sorted(svc.replicas.values(), key=lambda r: r.rid)
            spec, endpoint, routed, notes = svc.spec, svc.endpoint, svc.routed_to, tuple(svc.notes.values())
        out = []
        for rep in reps:
            alive = rep.proc.poll() is None
            info = procs.read_proc_status(rep.proc.pid) if alive else None
            limits = self._launch.cg.read(f"{spec.name}-{rep.rid}")
            version = threads = None
            if alive and rep.state == "ready":
                try:
                    body = procs.call("GET", f"{rep.url}/info", timeout_s=2.0, retries=0) or {}
                    version = body.get("model_version")
                    threads = body.get("threads")
                except procs.HttpError:
                    pass
            out.append(ReplicaStatus(
                name=f"{spec.name}-{rep.rid}", ready=alive and rep.state == "ready", address=rep.url,
                pid=rep.proc.pid if alive else None, cpus=info.cpus if info else None,
                cpu_quota=limits.cpu_quota, memory_limit=limits.memory_limit,
                threads=threads if isinstance(threads, int) else (info.threads if info else None),
                model_version=str(version) if version is not None else None,
            ))
        try:
            gw = procs.call("GET", f"{endpoint}/admin/state", timeout_s=2.0, retries=0) or {}
        except procs.HttpError as exc:
            gw = {}
            notes += (f"gateway state unreadable: {exc}",)
        if gw.get("routed_to") == "backup":
            routed = routed or spec.backup or "backup"
        elif gw.get("routed_to") == "primary":
            routed = spec.name
        if not self.cgroup_support.usable:
            notes += (f"cgroup limits not applied: {self.cgroup_support.reason}",)
        return ServiceStatus(
            name=spec.name, desired_replicas=spec.replicas, replicas=tuple(out), endpoint=endpoint,
            routed_to=routed or spec.name, notes=tuple(dict.fromkeys(notes)),
        )

    def delete(self, service: str) -> None:
        """Stop the service's gateway and replicas (adopted ones too) and forget it."""
        with self._lock:
            svc = self._services.pop(service, None)
            self._persist()
        if svc is None:
            return
        procs.stop(svc.gateway, STOP_GRACE_S)
        for rep in svc.replicas.values():
            procs.stop(rep.proc, STOP_GRACE_S)
            self._launch.cg.remove(f"{svc.spec.name}-{rep.rid}")

    def close(self) -> None:
        """Stop the supervisor, every service and remove our cgroups. Idempotent; also runs at exit."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            supervisors = [s.supervisor for s in self._services.values() if s.supervisor is not None]
        deadline = time.monotonic() + 5.0  # one bound for all: a tick still in HTTP changes nothing once closed (owns)
        for thread in supervisors:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for name in list(self._services):
            self.delete(name)
        self._launch.cg.remove_all()
        self._launch.close()
        self.state_path.unlink(missing_ok=True)  # nothing left to adopt
        atexit.unregister(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ------------------------------------------------------------------------------------
    def run_job(self, job: Job, params: dict[str, Any] | None = None) -> JobResult:
        """Run a job to completion or timeout as a child process, inside an MLflow run holding its log
        (scanflow.platform.local_jobs)."""
        return run_local_job(job, params, tracking_uri=self.tracking_uri, experiment=self.experiment,
                             jobs_dir=self.home / "jobs", env=self._launch.env("job"), python=self.python)
