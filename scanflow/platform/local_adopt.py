"""Taking over the services a killed local platform left running: which recorded processes are still
alive and still theirs, and the service records rebuilt around them.

`LocalPlatform.adopt` reads the state file (scanflow.platform.local_state), calls `take_over_services`
to find what can be kept, kills every other process of the home, then `rebuild` per service: the
surviving processes are watched by pid, a missing gateway is restarted on its port and missing
replicas are left dead for the supervisor to restart. Separate from the platform because it runs once,
at start-up, on a predecessor's record, and shares nothing with the running platform's calls but the
`Launcher` that restarts a gateway.
"""

from __future__ import annotations

import logging
from typing import Any

from scanflow.platform import processes as procs
from scanflow.platform.local_launch import Launcher
from scanflow.platform.local_state import _Replica, _Service, _Taken, take_over
from scanflow.spec import Service

log = logging.getLogger(__name__)

# per service: (spec, its record, the gateway if it is still it and answers, {rid: _Taken})
Found = dict[str, tuple[Service, dict[str, Any], procs.Adopted | None, dict[int, _Taken]]]


def take_over_services(data: dict[str, Any]) -> tuple[Found, set[int]]:
    """The recorded services whose spec is usable, each with the processes that are still the recorded
    ones, and the pids of those processes (the ones the sweep must spare)."""
    found: Found = {}
    keep: set[int] = set()
    for name, rec in (data.get("services") or {}).items():
        try:
            spec = Service.model_validate(rec["spec"])
        except (KeyError, ValueError) as exc:
            log.warning("service %s: recorded spec unusable (%s); not adopted", name, exc)
            continue
        gw, gw_ok = take_over(rec.get("gateway") or {}, "scanflow.serving.gateway", "/health")
        gw = gw if gw_ok else None
        reps = {}
        for r in rec.get("replicas") or []:
            proc, ready = take_over(r, "scanflow.serving.replica", "/ready")
            reps[int(r["rid"])] = (r, proc, ready)
        found[name] = (spec, rec, gw, reps)
        keep |= {p.pid for p in [gw, *(x[1] for x in reps.values())] if p is not None}
    return found, keep


def rebuild(spec: Service, rec: dict[str, Any], gw: procs.Adopted | None, reps: dict[int, _Taken],
            launcher: Launcher, now: float) -> tuple[_Service, list[str]]:
    """The service record around what was taken over, and what had to be restarted: a missing gateway
    is restarted now (on its recorded port), a missing replica is recorded dead and due for restart."""
    port = int((rec.get("gateway") or {}).get("port") or spec.port or 0)
    restarted = []
    if gw is None:
        listener = launcher.gateway_listener(port or None)
        port = int(listener.getsockname()[1])
        gw_proc: procs.Proc = launcher.spawn_gateway(spec, listener, rec.get("backup_url"))
        restarted.append("gateway")
    else:
        gw_proc = gw
    svc = _Service(spec=spec, gateway=gw_proc, gateway_port=port,
                   backup_url=rec.get("backup_url"), routed_to=rec.get("routed_to"))
    for rid, (r, proc, ready) in sorted(reps.items()):
        restarts = int(r.get("restarts") or 0)
        if proc is None:
            dead = procs.Adopted(int(r.get("pid") or 0), -1)
            dead.returncode = -1
            svc.replicas[rid] = _Replica(rid=rid, port=int(r.get("port") or 0), proc=dead, state="dead",
                                         restarts=restarts, restart_at=now)
            restarted.append(f"replica {rid}")
        else:
            svc.replicas[rid] = _Replica(rid=rid, port=int(r["port"]), proc=proc,
                                         state="ready" if ready else "starting", restarts=restarts)
    return svc, restarted
