"""The local platform's supervision: a thread per service keeps its processes up and its gateway current.

Each tick observes (under the platform's lock: restart an exited gateway, mark exited replicas dead,
respawn dead ones whose backoff is over), probes (outside it: the gateway's /health, each starting
replica's /ready), promotes (under it again, re-checking each replica is still the one probed: place
it and join the ready set, or give up on one past its deadline) and updates the gateway's replica list
(outside it). One thread per service, so one service's slow probe never delays another's crash
restarts. It is separate from `LocalPlatform` because it is the platform's only background activity:
the public calls change the services and wait on what the supervisor does (`wait_ready`), never the
other way round. It shares the platform's services, lock and closed flag, and starts processes
through the platform's `Launcher`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scanflow.platform import processes as procs
from scanflow.platform.base import PlatformError
from scanflow.platform.local_launch import Launcher
from scanflow.platform.local_state import _Observed, _Replica, _Service

log = logging.getLogger(__name__)

READY_DEADLINE_S = 120.0  # a replica imports torch + mlflow and loads a model: slow on a busy 2-core box
MAX_BACKOFF_S = 10.0


def put_replicas(endpoint: str, urls: tuple[str, ...], headers: dict[str, str]) -> str | None:
    """Send the gateway its replica list; the error as text, or None. Touches no state (no lock needed)."""
    try:
        procs.call("PUT", f"{endpoint}/admin/replicas", json={"replicas": list(urls)},
                   headers=headers, timeout_s=15.0)
        return None
    except procs.HttpError as exc:
        return str(exc)


def send_backup(endpoint: str, url: str | None, headers: dict[str, str]) -> str | None:
    """Tell a gateway its backup; a note on failure, or None. Touches no state (no lock needed)."""
    try:
        procs.call("PUT", f"{endpoint}/admin/backup", json={"url": url}, headers=headers)
        return None
    except procs.HttpError as exc:
        return f"backup not set on gateway: {exc}"


def ready_urls(svc: _Service) -> tuple[str, ...]:
    """The replica URLs the gateway should hold (caller holds the lock)."""
    return tuple(sorted(r.url for r in svc.replicas.values() if r.state == "ready"))


def record_sync(svc: _Service, urls: tuple[str, ...], error: str | None) -> None:
    """Record what the gateway holds after a replica-list update (caller holds the lock). If the
    ready set moved on meanwhile, the next supervisor tick sends the difference."""
    if error is None:
        svc.registered = urls
        svc.notes.pop("gateway", None)
    else:
        svc.registered = None
        svc.notes["gateway"] = f"gateway not updated: {error}"


class Supervisor:
    """Supervises the services in `services` (the platform's dict, guarded by `lock`) until `closed`
    is set; `persist` writes the platform's state (called under `lock`)."""

    def __init__(
        self, services: dict[str, _Service], lock: threading.RLock, closed: threading.Event,
        launcher: Launcher, persist: Callable[[], None], headers: dict[str, str], interval_s: float,
    ) -> None:
        self._services = services
        self._lock = lock
        self._closed = closed
        self._launcher = launcher
        self._persist = persist
        self._headers = headers
        self._interval = interval_s

    def owns(self, svc: _Service) -> bool:
        """`svc` is still deployed here (not deleted, platform not closed). Caller holds the lock."""
        return not self._closed.is_set() and self._services.get(svc.spec.name) is svc

    def start(self, svc: _Service) -> None:
        """One supervisor thread per service (caller holds the lock), so a slow probe or gateway
        update of one service never delays another's crash restarts."""
        svc.supervisor = threading.Thread(
            target=self._supervise, args=(svc,), name=f"scanflow-supervisor-{svc.spec.name}", daemon=True
        )
        svc.supervisor.start()

    def _supervise(self, svc: _Service) -> None:
        """The service's supervisor: a tick per interval until it is deleted or the platform closed."""
        while not self._closed.wait(self._interval):
            try:
                if not self.tick(svc):
                    return
            except Exception:  # never let the supervisor die
                log.exception("supervisor tick failed for %s", svc.spec.name)

    def observe(self, svc: _Service, now: float) -> _Observed:
        """A tick's first step (caller holds the lock; local calls only): restart an exited gateway,
        mark exited replicas dead, respawn dead ones whose backoff is over, and say what to probe."""
        if svc.gateway.poll() is not None:
            try:
                listener = self._launcher.gateway_listener(svc.gateway_port)
            except PlatformError as exc:  # its port was taken meanwhile: the next tick tries again
                note = f"gateway exited ({svc.gateway.returncode}); not restarted yet: {exc}"
                if svc.notes.get("gateway-restart") != note:  # logged once per cause, not on every tick
                    log.warning("service %s: %s", svc.spec.name, note)
                svc.notes["gateway-restart"] = note  # and shown in status() while it lasts
            else:
                log.warning("service %s: gateway exited (%s); restarting", svc.spec.name, svc.gateway.returncode)
                svc.notes.pop("gateway-restart", None)
                svc.gateway = self._launcher.spawn_gateway(svc.spec, listener, svc.backup_url)
                svc.registered = None
        for rid, rep in list(svc.replicas.items()):
            if rep.state != "dead" and rep.proc.poll() is not None:
                log.warning("service %s: replica %d exited (%s)", svc.spec.name, rep.rid, rep.proc.returncode)
                rep.state = "dead"
                rep.restart_at = now + min(MAX_BACKOFF_S, 0.5 * 2 ** rep.restarts)
            if rep.state == "dead" and now >= rep.restart_at:
                self._launcher.cg.remove(f"{svc.spec.name}-{rid}")
                svc.replicas[rid] = self._launcher.spawn_replica(svc, rid, restarts=rep.restarts + 1)
        starting = tuple(r for r in svc.replicas.values() if r.state == "starting")
        return _Observed(gateway=svc.gateway, endpoint=svc.endpoint, probe_gateway=svc.registered is None,
                         starting=starting)

    def promote(self, svc: _Service, probed: list[tuple[_Replica, bool]], now: float) -> list[_Replica]:
        """A tick's third step (caller holds the lock): a replica that answered /ready is placed and
        joins the ready set; one past its deadline is marked dead (returned, to stop outside the lock).
        A replica retired (scale) or replaced meanwhile is not this service's any more: left alone."""
        overdue = []
        for rep, ready in probed:
            if svc.replicas.get(rep.rid) is not rep or rep.state != "starting":
                continue
            if ready:
                notes = self._launcher.apply_to_replica(svc, rep)
                svc.notes.update({f"replica-{rep.rid}-{i}": n for i, n in enumerate(notes)})
                rep.state = "ready"
            elif now - rep.started_at > READY_DEADLINE_S:
                rep.state = "dead"
                rep.restart_at = now + min(MAX_BACKOFF_S, 0.5 * 2 ** rep.restarts)
                svc.notes[f"replica-{rep.rid}-ready"] = f"replica {rep.rid} not ready in {READY_DEADLINE_S:.0f}s"
                overdue.append(rep)
        return overdue

    def tick(self, svc: _Service) -> bool:
        """One reconciliation step: observe (under the lock) -> probe (outside it) -> promote (under
        it, re-checking each replica is still the one probed) -> update the gateway (outside it).
        So status(), the public calls and other services never wait on a probe. Only the service's
        own supervisor thread calls it, so ticks of one service never overlap. False: service gone."""
        with self._lock:
            if not self.owns(svc):
                return False
            obs = self.observe(svc, time.monotonic())
            self._persist()
        gateway_up = not obs.probe_gateway or procs.is_ready(f"{obs.endpoint}/health", 1.0)
        probed = [(rep, procs.is_ready(f"{rep.url}/ready", 1.0)) for rep in obs.starting]
        with self._lock:
            if not self.owns(svc):
                return False
            overdue = self.promote(svc, probed, time.monotonic())
            self._persist()
        for rep in overdue:  # the next tick (same thread) restarts the slot once this one is gone
            procs.stop(rep.proc, 2.0)
        if gateway_up:
            self.sync_gateway(svc, obs.gateway)
        return True

    def sync_gateway(self, svc: _Service, gateway: procs.Proc | None = None) -> None:
        """Bring the gateway's replica list up to date (a no-op when it already holds the ready set);
        a gateway whose state is unknown (new or restarted: `registered` is None) also gets its backup
        and forced route again. Caller must NOT hold the lock: the list is computed under it, sent
        outside it (15 s x 4 tries at worst) and recorded under it, all inside `svc.gateway_io`, so
        two updates never cross and the list sent last is always the one computed last.
        `gateway`: act only if the service still runs this gateway process (the one a tick probed)."""
        with svc.gateway_io:
            with self._lock:
                if not self.owns(svc) or (gateway is not None and svc.gateway is not gateway):
                    return
                urls = ready_urls(svc)
                if urls == svc.registered:
                    return
                fresh = svc.registered is None
                current, endpoint, backup, routed = svc.gateway, svc.endpoint, svc.backup_url, svc.routed_to
            error = put_replicas(endpoint, urls, self._headers)
            notes: dict[str, str] = {}
            if fresh and error is None:
                if backup and (backup_error := send_backup(endpoint, backup, self._headers)) is not None:
                    notes["backup"] = backup_error
                if routed:  # a restarted gateway forgot a forced route
                    try:
                        procs.call("PUT", f"{endpoint}/admin/route", json={"to": "backup"}, headers=self._headers)
                    except procs.HttpError as exc:
                        notes["route"] = f"route to backup not restored: {exc}"
            with self._lock:
                if svc.gateway is not current:
                    return  # restarted meanwhile: the new one starts unknown and is re-fed by the next tick
                record_sync(svc, urls, error)
                svc.notes.update(notes)
                self._persist()

    def wait_ready(self, name: str, deadline_s: float = READY_DEADLINE_S) -> None:
        """Wait (polling state under the lock, no HTTP) until the supervisor has every replica of
        `name` ready and the gateway holds exactly them."""
        def done() -> bool:
            with self._lock:
                svc = self._services.get(name)
                if svc is None:
                    return True
                ready = all(r.state == "ready" for r in svc.replicas.values())
                return ready and svc.registered == ready_urls(svc)

        if not procs.wait_until(done, deadline_s, 0.1):
            raise PlatformError(
                f"service {name!r}: replicas not ready within {deadline_s:.0f}s "
                f"(logs in {self._launcher.home / 'logs'})",
                retryable=True,
            )
