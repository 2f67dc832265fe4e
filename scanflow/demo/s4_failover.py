"""S4 failover: the primary's replicas die, traffic goes to the backup service, the primary recovers
(the platform's supervisor restarts its replicas), traffic returns.

On the EmbeddedStack: the replica processes of the primary service (found by their command
line and the Executor's SCANFLOW_HOME) get SIGKILL, as a crash would; the answers' upstream header
(x-scanflow-upstream) says who served each request, so the scenario measures, without steering,
when traffic left the primary and when it came back. The gateway fails over by itself within a
second, so traffic on the backup proves nothing about the agents: the primary is kept down (its
restarted replicas killed again) until the Planner decides the failover from the Checker's health
checks, and the scenario passes only if the Planner's audit log (/plans) holds that decision and the
route back, in order, and the Executor's (/decisions) both routes applied.
Who calls: scanflow.demo.runner.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from scanflow.demo.common import DemoContext, traffic_rows, wait_for
from scanflow.demo.load import Load, Sample
from scanflow.demo.report import ScenarioResult

BAR = ("through the agents: the Planner decides the failover and the route back, the Executor applies both; "
       "the backup serves meanwhile, traffic back on the primary; <= 1% failed")


def primary_replica_pids(executor_home: Path, service: str) -> list[int]:
    """Replica processes of `service` started by the Executor's platform."""
    from scanflow.embedded.leftovers import find_leftovers
    from scanflow.platform.processes import cmdline

    out = []
    for pid in find_leftovers(executor_home):
        args = cmdline(pid)  # [] once gone
        if "scanflow.serving.replica" in args and "--service" in args:
            i = args.index("--service")
            if i + 1 < len(args) and args[i + 1] == service:
                out.append(pid)
    return out


def served_by_backup(s: Sample, backup_url: str) -> bool:
    return s.upstream is not None and bool(s.upstream) and s.upstream.rstrip("/").startswith(backup_url.rstrip("/"))


def per_second(samples: list[Sample], t0: float, backup_url: str) -> dict[str, list[float]]:
    """Pure: per-second share of answers from the backup and failed counts, t relative to t0."""
    buckets: dict[int, list[Sample]] = {}
    for s in samples:
        buckets.setdefault(int(s.t - t0), []).append(s)
    out: dict[str, list[float]] = {"t": [], "backup_share": [], "failed": []}
    for sec in sorted(buckets):
        b = buckets[sec]
        ok = [s for s in b if s.status == 200]
        out["t"].append(float(sec))
        out["backup_share"].append(sum(served_by_backup(s, backup_url) for s in ok) / len(ok) if ok else 0.0)
        out["failed"].append(float(sum(1 for s in b if s.status != 200)))
    return out


def route_decisions(plans: list[dict[str, Any]], since: float) -> list[str]:
    """Pure: where the Planner's failover decisions since `since` (wall time) sent the traffic, in order
    (only the decisions that changed the route)."""
    return [str(p.get("route_to")) for p in sorted(plans, key=lambda p: float(p.get("at") or 0.0))
            if p.get("policy") == "failover" and p.get("changed") and float(p.get("at") or 0.0) >= since]


def executed_routes(decisions: list[dict[str, Any]], since: float) -> int:
    """Pure: the Executor's route plans since `since` that fired and whose every action succeeded."""
    return sum(1 for d in decisions if d.get("strategy") == "execute-route" and d.get("result") == "fired"
               and float(d.get("at") or 0.0) >= since
               and all(o.get("status") == "ok" for o in (d.get("outcomes") or {}).values()))


def verdict(failed: int, requests: int, on_backup: bool, returned: bool, routes: list[str], executed: int) -> bool:
    """Pure: S4 passes only through the agents: the Planner decided the failover and the route back
    (in that order, nothing else), the Executor applied both, the backup served and traffic came back.
    Failed requests: at most 1% (at least 2 allowed): the primary is killed again while it restarts, and
    a request in flight on a replica killed mid-answer can fail even though the gateway retries it."""
    return (routes == ["backup", "primary"] and executed >= 2 and on_backup and returned
            and failed <= max(2, requests // 100))


def run(ctx: DemoContext) -> ScenarioResult:
    from scanflow.agentkit.env import primary_service

    res = ScenarioResult("s4", "failover and failback", BAR)
    stack = ctx.stack
    if stack is None:
        res.error = "the embedded stack (agents) is not running"
        return res
    primary = primary_service(stack.workflow)
    if not primary.backup:
        res.error = f"service {primary.name!r} names no backup"
        return res
    backup_url = stack.service_urls[primary.backup]
    deadline = 90.0 if ctx.quick else 150.0
    home = stack.agent_home("executor")

    def planner_routes() -> list[str]:
        try:
            return route_decisions(list(stack.get("planner", "/plans")), wall_killed)
        except Exception:  # noqa: BLE001 - a Planner busy for a moment: asked again on the next poll
            return []

    def kill() -> list[int]:
        pids = primary_replica_pids(home, primary.name)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    t0 = time.monotonic()
    with Load(stack.service_url, traffic_rows(ctx), concurrency=3, max_clients=3) as load:
        wait_for(lambda: len(load.samples()) > 100, 30)
        wall_killed = time.time()
        killed_at = time.monotonic()
        pids = kill()
        if not pids:
            res.error = f"no replica process of {primary.name!r} found"
            return res
        ctx.say(f"S4: killing the primary's replicas (pids {pids}) until the Planner decides the failover")
        on_backup = wait_for(lambda: any(served_by_backup(s, backup_url) for s in load.samples(killed_at)), 30,
                             interval_s=0.1)
        moved = min((s.t for s in load.samples(killed_at) if served_by_backup(s, backup_url)), default=None)
        # the platform restarts the replicas within seconds: keep the primary down (kill what restarts)
        # until the Planner's failover decision, which waits for several failed health checks
        def kept_down_until_decided() -> bool:
            kill()
            return planner_routes()[:1] == ["backup"]

        decided = wait_for(kept_down_until_decided, deadline, interval_s=0.3)
        kills_stopped = time.monotonic()
        ctx.say("S4: the Planner routed to the backup; the primary recovers; waiting for the route back")

        def back_on_primary() -> bool:
            recent = [s for s in load.samples(kills_stopped) if s.status == 200][-30:]
            return (len(recent) == 30 and not any(served_by_backup(s, backup_url) for s in recent)
                    and planner_routes()[-1:] == ["primary"])

        returned_ok = decided and wait_for(back_on_primary, deadline, interval_s=0.5)
        returned = None
        if returned_ok:
            after = [s for s in load.samples(killed_at) if s.status == 200]
            returned = max((s.t for s in after if served_by_backup(s, backup_url)), default=killed_at)
        time.sleep(1.0)  # a last second of answers for the plot (measurement window)
        samples = load.samples()
    try:
        plans = [p for p in stack.get("planner", "/plans") if p.get("policy") == "failover" and p.get("changed")
                 and float(p.get("at") or 0.0) >= wall_killed]
        routes = route_decisions(plans, wall_killed)
        executed = executed_routes(stack.decisions("executor", limit=1000), wall_killed)
    except Exception as exc:  # noqa: BLE001 - the verdict then fails with the reason shown
        plans, routes, executed = [{"reason": f"planner or executor unreadable: {exc}"}], [], 0
    failed = sum(1 for s in samples if s.status != 200)
    backup_n = sum(1 for s in samples if s.status == 200 and served_by_backup(s, backup_url))
    res.decisions = [f"route -> {p.get('route_to')}: {str(p.get('reason', ''))[:80]}" for p in plans]
    res.figures = {
        "requests": len(samples), "failed": failed, "served_by_backup": backup_n,
        "killed_replicas": len(pids), "planner_routes": " -> ".join(routes) or "none",
        "executor_routes": executed,
        "failover_after_s": round(moved - killed_at, 2) if moved else None,
        "planner_failover_after_s": round(float(plans[0]["at"]) - wall_killed, 1) if routes else None,
        "failback_after_s": round(returned - killed_at, 1) if returned else None,
    }
    res.passed = verdict(failed, len(samples), on_backup, returned_ok, routes, executed)
    marks = {"primary killed": killed_at - t0, "kills stopped": kills_stopped - t0}
    if returned:
        marks["back on primary"] = returned - t0
    res.series = {**per_second(samples, t0, backup_url), "marks": marks}
    return res
