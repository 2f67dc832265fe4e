"""S2 autoscale through the agents: a real load step on the stack's service; the Checker sees the SLO
breach, the Planner decides with its autoscale policy, the Executor scales the LocalPlatform; the load
falls and the same chain scales back down, once. Plus the HPA comparison, simulated.

Real part: on the running EmbeddedStack (S1 and S4 ran with autoscale off), the scenario turns the
Planner's `autoscale` strategy on over REST (POST /strategies: the digits workflow's own strategy,
`latency.checked` -> `plan_scale`), then drives a closed-loop load 2 -> 24 -> 2 clients against the
primary service's gateway. First it measures p99 at 2 clients and sets the SLO the Checker holds
(`set_slo`) to the service's 50 ms, or 2x that p99 when the shared machine is busier (the median of
per-second p99s of the gateway's own histogram, which the Checker judges). It steers nothing: each second it only records p99 (client side), the
replicas the gateway serves and the clients. Afterwards it reads what the agents decided from their
audit logs: the Planner's policy decisions (GET /plans: action, reason, inputs) and its strategy
decisions and the Executor's (`stack.decisions(role)`: `autoscale`, `execute-scale` fired). The
strategy is removed again at the end (S3 runs on its own platform). The guardrail durations are
divided by the demo workflow's `time_scale` (runner.demo_workflow) so the scenario fits in ~1 minute.
Comparison part: scanflow.demo.sim runs the same policy and the HPA algorithm on one trace with real
HPA timings; those figures are labelled `sim_*` (a simulation, not this run).
Who calls: scanflow.demo.runner.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import httpx

from scanflow.demo.common import DemoContext, clean_rows
from scanflow.demo.load import Load
from scanflow.demo.report import ScenarioResult
from scanflow.demo.sim import SimConfig, Trace, compare

SLO_MS = 50.0  # the digits service's SLO (p99)
SLO_BASELINE_FACTOR = 2.0  # the histogram buckets grow ~2-2.5x: over the SLO = 2 buckets above the baseline
CALIBRATE_S = 5.0
STRATEGY = "autoscale"  # the Planner strategy the scenario turns on (the digits workflow's)
BAR = ("through the agents: the Planner scales up during the load step and back down after it, 0 flaps "
       "(a direction change beyond that one up -> down), the service ends on its minimum, 0 failed requests")


def calibrated_slo(baseline_p99_ms: float | None) -> float:
    """The SLO the Checker holds for the run: the service's 50 ms, or 2x the p99 measured at low load when
    the machine is busier than that (a shared 2-core box), so 'over the SLO' still means 'overloaded'."""
    if baseline_p99_ms is None:
        return SLO_MS
    return max(SLO_MS, round(SLO_BASELINE_FACTOR * baseline_p99_ms, 1))


def phases(quick: bool) -> tuple[float, float, float]:
    """(low before the step, the step, the most to wait after it for the scale-down), seconds."""
    return (3.0, 20.0, 60.0) if quick else (8.0, 30.0, 90.0)


def reversals(replicas: Sequence[int]) -> int:
    """Direction changes in a replica series (up then down counts 1)."""
    last, n = 0, 0
    for a, b in itertools.pairwise(replicas):
        if a != b:
            d = 1 if b > a else -1
            n += int(last != 0 and d != last)
            last = d
    return n


def flaps(directions: Sequence[str]) -> int:
    """Pure: direction changes among scale moves ('up' / 'down') beyond the one the step asks for (up, then
    down). [up, up, down] -> 0; [up, down, up] -> 1; [down, up] -> 1."""
    changes = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    expected = 1 if directions and directions[0] == "up" and "down" in directions else 0
    return changes - expected


def autoscale_strategy() -> dict[str, Any]:
    """The digits workflow's own Planner autoscale strategy, as JSON for POST /strategies."""
    from workflows.digits.workflow import workflow

    planner = next(a for a in workflow.agents if a.role == "planner")
    spec = next(s for s in planner.strategies if s.name == STRATEGY)
    return spec.model_dump(mode="json")


def _request(stack: Any, method: str, role: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, stack.agent_urls[role] + path, json=body, timeout=30.0,
                         headers={"Authorization": f"Bearer {stack.token}"})


def gateway_histogram(url: str) -> dict[float, float]:
    """The gateway's cumulative latency histogram now ({} when unreadable)."""
    from scanflow.embedded.latency import histogram

    try:
        return histogram(httpx.get(f"{url}/metrics", timeout=5.0).text, "scanflow_gateway_request_latency_seconds")
    except httpx.HTTPError:
        return {}


def gateway_percentile(before: dict[float, float], after: dict[float, float], svc: Any) -> float | None:
    """The SLO percentile between two snapshots as the Checker computes it (the gateway's own histogram:
    the client side also counts the time a request waits for the CPU-starved gateway, the Checker not)."""
    from scanflow.embedded.latency import percentile_ms

    p = percentile_ms(before, after, (svc.slo.percentile if svc.slo else 99.0) / 100.0) if after else None
    return None if p is None else p.ms


def median(values: Sequence[float]) -> float | None:
    xs = sorted(values)
    return None if not xs else (xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)


def baseline_p99(url: str, svc: Any, seconds: float) -> float | None:
    """The median of the per-second gateway p99s over `seconds` at the present load: the windows the
    Checker judges, and a median so one busy second of the shared machine does not set the SLO."""
    values: list[float] = []
    prev = gateway_histogram(url)
    for _ in range(max(1, int(seconds))):
        time.sleep(1.0)  # one measurement window, not a synchronisation
        cur = gateway_histogram(url)
        p = gateway_percentile(prev, cur, svc)
        if p is not None:
            values.append(p)
        prev = cur
    return median(values)


def serving_replicas(url: str) -> int | None:
    """How many replicas the service's gateway routes to now (None: gateway unreadable)."""
    try:
        return len(httpx.get(f"{url}/admin/state", timeout=2.0).json().get("replicas") or [])
    except (httpx.HTTPError, ValueError):
        return None


def scale_moves(plans: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    """Pure: the Planner's autoscale decisions since `since` (wall time) that moved the count."""
    return [p for p in plans if p.get("policy") == "autoscale" and float(p.get("at") or 0.0) >= since
            and p.get("action") in ("up", "down")]


def run(ctx: DemoContext) -> ScenarioResult:
    from scanflow.embedded.env import primary_service

    res = ScenarioResult("s2", "autoscale", BAR)
    stack = ctx.stack
    if stack is None:
        res.error = "the embedded stack (agents) is not running"
        return res
    svc = primary_service(stack.workflow)
    url = stack.service_url
    low, high, wait_down = phases(ctx.quick)
    t_series: list[float] = []
    p99s: list[float | None] = []
    reps: list[int] = []
    clients: list[int] = []
    slo = SLO_MS
    try:
        with Load(url, clean_rows(), concurrency=2, max_clients=24) as load:
            ctx.say("S2: measuring p99 at low load to calibrate the SLO the Checker holds")
            slo = calibrated_slo(baseline_p99(url, svc, CALIBRATE_S))
            set_slo = _request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": slo}})
            added = _request(stack, "POST", "planner", "/strategies", autoscale_strategy())
            if set_slo.status_code != 200 or added.status_code != 201:
                res.error = (f"could not set the SLO ({set_slo.status_code}) or turn the Planner's autoscale on "
                             f"({added.status_code}): {added.text[:200]}")
                return res
            ctx.say(f"S2: SLO {slo:.0f} ms, Planner autoscale on; load 2 clients, then a step to 24")
            wall0 = time.time()
            start = time.monotonic()
            step_at, fall_at = start + low, start + low + high
            end = fall_at + wait_down
            down_seen_at: float | None = None
            while (now := time.monotonic()) < end:
                c = 24 if step_at <= now < fall_at else 2
                load.concurrency = c
                n = serving_replicas(url)
                w = load.window(1.0)
                t_series.append(round(now - start, 2))
                p99s.append(w.p99_ms)
                reps.append(n if n is not None else (reps[-1] if reps else svc.replicas))
                clients.append(c)
                ctx.say(f"S2: t={now - start:.0f}s clients {c}, p99 {w.p99_ms or 0:.0f} ms, replicas {reps[-1]}")
                if now >= fall_at and reps[-1] <= svc.min_replicas and max(reps) > svc.min_replicas:
                    down_seen_at = down_seen_at or now
                    if now - down_seen_at >= 3.0:  # a few more seconds at the minimum: a flap would show
                        break
                time.sleep(max(0.0, now + 1.0 - time.monotonic()))
            samples = load.samples()
    finally:
        _request(stack, "DELETE", "planner", f"/strategies/{STRATEGY}")
        _request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": None}})
    step_wall, fall_wall = wall0 + low, wall0 + low + high
    plans = scale_moves(list(stack.get("planner", "/plans")), wall0)
    fired = [d for d in stack.decisions("planner", limit=1000)
             if d.get("strategy") == STRATEGY and d.get("result") == "fired" and float(d.get("at") or 0) >= wall0]
    executed = [d for d in stack.decisions("executor", limit=1000)
                if d.get("strategy") == "execute-scale" and d.get("result") == "fired"
                and float(d.get("at") or 0) >= wall0]
    directions = [str(p["action"]) for p in plans]
    ups = [p for p in plans if p["action"] == "up" and step_wall <= float(p["at"]) <= fall_wall + 2.0]
    downs = [p for p in plans if p["action"] == "down" and float(p["at"]) > fall_wall]
    failed = sum(1 for s in samples if s.status != 200)
    res.decisions = [f"t={float(p['at']) - wall0:.0f}s {p['action']} {p.get('current')}->{p.get('replicas')}: "
                     f"{str(p.get('reason', ''))[:70]}" for p in plans]
    high_p99 = [p for p, c in zip(p99s, clients, strict=True) if c == 24 and p is not None]
    sim = compare(Trace(), SimConfig(slo_ms=SLO_MS, max_replicas=8))
    pf, hf = sim["planner"].figures(), sim["hpa"].figures()
    res.figures = {
        "requests": len(samples), "failed": failed, "max_replicas": max(reps, default=0),
        "final_replicas": reps[-1] if reps else None,
        "scale_up_after_s": round(float(ups[0]["at"]) - step_wall, 1) if ups else None,
        "scale_down_after_s": round(float(downs[0]["at"]) - fall_wall, 1) if downs else None,
        "planner_moves": len(plans), "flaps": flaps(directions), "replica_reversals": reversals(reps),
        "latency_events_acted_on": len(fired), "executor_scale_actions": len(executed),
        "p99_high_first_ms": high_p99[0] if high_p99 else None, "p99_high_last_ms": high_p99[-1] if high_p99 else None,
        "slo_ms": slo, "declared_slo_ms": svc.slo.latency_ms if svc.slo else None,
        # simulation (scanflow.demo.sim), not this run: the same policy vs the HPA algorithm on one trace
        "sim_planner_slo_violation_s": pf["slo_violation_s"], "sim_hpa_slo_violation_s": hf["slo_violation_s"],
        "sim_planner_replica_s": pf["replica_s"], "sim_hpa_replica_s": hf["replica_s"],
        "sim_planner_reversals": pf["reversals"], "sim_hpa_reversals": hf["reversals"],
    }
    res.passed = (bool(ups) and bool(downs) and flaps(directions) == 0 and bool(reps)
                  and reps[-1] == svc.min_replicas and failed == 0)
    res.series = {"t": t_series, "p99": p99s, "replicas": reps, "clients": clients,
                  "sim": {k: (v.t, v.replicas, v.latency_ms) for k, v in sim.items()},
                  "slo_ms": slo, "sim_slo_ms": SLO_MS}
    return res
