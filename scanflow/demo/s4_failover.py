"""S4 failover: the primary's replicas die, traffic goes to the backup service, the primary recovers
(the platform's supervisor restarts its replicas), traffic returns.

On the EmbeddedStack: the replica processes of the primary service (found in /proc by their command
line and the Executor's SCANFLOW_HOME) get SIGKILL, as a crash would; the answers' upstream header
(x-scanflow-upstream) says who served each request, so the scenario measures, without steering,
when traffic left the primary and when it came back. The gateway fails over by itself; the
Checker/Planner chain records its own failover decisions (shown in the table).
Who calls: scanflow.demo.runner.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from scanflow.demo.common import DemoContext, clean_rows, wait_for
from scanflow.demo.load import Load, Sample
from scanflow.demo.report import ScenarioResult

BAR = "0 failed requests; the backup serves while the primary is down; traffic back on the primary within the deadline"


def primary_replica_pids(executor_home: Path, service: str) -> list[int]:
    """Replica processes of `service` started by the Executor's platform (Linux /proc)."""
    from scanflow.embedded.leftovers import find_leftovers

    out = []
    for pid in find_leftovers(executor_home):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"scanflow.serving.replica" in args and b"--service" in args:
            i = args.index(b"--service")
            if i + 1 < len(args) and args[i + 1].decode() == service:
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


def run(ctx: DemoContext) -> ScenarioResult:
    from scanflow.embedded.env import primary_service

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
    t0 = time.monotonic()
    with Load(stack.service_url, clean_rows(), concurrency=3, max_clients=3) as load:
        wait_for(lambda: len(load.samples()) > 100, 30)
        pids = primary_replica_pids(stack.agent_home("executor"), primary.name)
        if not pids:
            res.error = f"no replica process of {primary.name!r} found"
            return res
        ctx.say(f"S4: killing the primary's replicas (pids {pids})")
        killed_at = time.monotonic()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        on_backup = wait_for(lambda: any(served_by_backup(s, backup_url) for s in load.samples(killed_at)), 30,
                             interval_s=0.1)
        moved = min((s.t for s in load.samples(killed_at) if served_by_backup(s, backup_url)), default=None)
        ctx.say("S4: traffic on the backup; waiting for the primary to recover and take it back")

        def back_on_primary() -> bool:
            recent = [s for s in load.samples(killed_at) if s.status == 200][-30:]
            return len(recent) == 30 and not any(served_by_backup(s, backup_url) for s in recent)

        returned_ok = wait_for(back_on_primary, deadline, interval_s=0.5)
        returned = None
        if returned_ok:
            after = [s for s in load.samples(killed_at) if s.status == 200]
            last_backup = max((s.t for s in after if served_by_backup(s, backup_url)), default=killed_at)
            returned = last_backup
        time.sleep(1.0)  # a last second of answers for the plot (measurement window)
        samples = load.samples()
    try:
        plans = [p for p in stack.get("planner", "/plans") if p.get("policy") == "failover" and p.get("changed")]
    except Exception as exc:  # noqa: BLE001 - the table shows it; the scenario's figures stand on their own
        plans = [{"reason": f"planner unreadable: {exc}"}]
    failed = sum(1 for s in samples if s.status != 200)
    backup_n = sum(1 for s in samples if s.status == 200 and served_by_backup(s, backup_url))
    res.decisions = [str(p.get("reason", ""))[:90] for p in plans]
    res.figures = {
        "requests": len(samples), "failed": failed, "served_by_backup": backup_n,
        "killed_replicas": len(pids),
        "failover_after_s": round(moved - killed_at, 2) if moved else None,
        "failback_after_s": round(returned - killed_at, 1) if returned else None,
    }
    res.passed = failed == 0 and on_backup and returned_ok
    marks = {"primary killed": killed_at - t0}
    if returned:
        marks["back on primary"] = returned - t0
    res.series = {**per_second(samples, t0, backup_url), "marks": marks}
    return res
