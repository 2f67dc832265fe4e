"""S2 autoscale through the agents (the default; SCANFLOW_DEMO_S2=inprocess, no running stack or no cgroup
CPU limits run the in-process S2 of scanflow.demo.s2_inprocess instead): an open-loop load step saturates
the stack's service at a per-replica CPU limit; the Checker sees the SLO breach at the gateway, the Planner decides with its autoscale policy,
the Executor scales the LocalPlatform; the load falls and the same chain scales back down, once. Plus
the HPA comparison, simulated.

Why a CPU limit and an open loop: the digits service serves thousands of requests/s on this machine
(the gateway coalesces requests into micro-batches), more than any Python load generator sends, so a
closed loop of Python clients never overloaded it (the gateway p99 the Checker judges stayed under the
SLO and the Planner rightly never scaled). Here the scenario gives each replica a small CPU limit through
the Executor (`set_resources`: a cgroup CFS quota, as a pod's CPU limit on Kubernetes, 1 thread), so
one replica serves only a few hundred requests/s, and sends requests on a schedule from a child process
(the load generator's child-process host, `python -m scanflow.loadgen`): the arrivals do not slow down
when the service does.

Steps, on the running EmbeddedStack (S1 and S4 ran with autoscale off):
1. CPU limit `REPLICA_CPU` on the primary service via the Executor; no cgroup support -> the in-process
   S2 (scanflow.demo.s2_inprocess) runs instead, reported as a fallback: its figures are shown, and the
   scenario does not pass (the agents did not decide).
2. Calibration, each run: a rate ramp while the replica's CPU time is read from /proc; one replica's
   capacity is the rate where it uses SATURATED of its limit, or the last rate before the gateway p99
   broke the SLO on a machine too busy to give it that (`capacity`); the step's rates are fractions of
   it (`rates`). A ramp that reaches MAX_RATE (the most the generator sends here) without saturating the
   replica means no step could overload it: the limit is lowered to fit (`fitted_cpu`), the ramp runs
   again, and the Planner's strategy gets that limit as its floor. The median gateway p99 at the low rate sets the SLO the Checker holds
   (`calibrated_slo`, via the Checker's `set_slo`), so on a busy machine 'over the SLO' still means
   'overloaded'.
3. The Planner's `autoscale` strategy is turned on over REST (POST /strategies); the load steps
   low -> high -> low. The scenario steers nothing: each second it records the client-side p99 and the
   replicas the gateway serves.
4. Verdict from the agents' audit logs: the Planner's policy decisions (GET /plans: action, reason,
   inputs), its strategy decisions and the Executor's (`stack.decisions(role)`). Afterwards the strategy
   is removed, the SLO override cleared and the declared resources and replica count restored.
The guardrail durations are divided by the demo workflow's `time_scale` (runner.DEMO_AUTOSCALE).
Comparison part: scanflow.demo.sim runs the same policy (vertical-first) and the HPA algorithm on one
trace, on the agents' observations (delayed, noisy: scanflow.policies.simulated); those figures are
labelled `sim_*` (a simulation, not this run).
The pure capacity and SLO arithmetic is scanflow.demo.s2_capacity; the reads and actions on the stack
(gateway metrics, replica CPU, the agents' actuators, the calibration ramp) are scanflow.demo.s2_stack.
Who calls: scanflow.demo.runner; tests/e2e/test_s2_autoscale.py.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from scanflow.demo.common import DemoContext, reversals, traffic_rows, wait_for
from scanflow.demo.load import OpenLoad
from scanflow.demo.report import ScenarioResult
from scanflow.demo.s2_capacity import (
    HIGH_FRACTION,
    MAX_RATE,
    SLO_MS,
    Rates,
    calibrated_slo,
    capacity,
    fitted_cpu,
    median,
    rates,
)
from scanflow.demo.s2_stack import (
    STRATEGY,
    agent_request,
    autoscale_strategy,
    calibrate,
    gateway_p99s,
    limited_replicas,
    planner_latency_low,
    restore_declared,
    run_executor_actuator,
    serving_replicas,
    start_declared,
)
from scanflow.demo.sim import SimConfig, Trace, compare
from scanflow.loadgen_engine import Second

REPLICA_CPU = 0.25  # cores per replica during S2 (a CFS quota, as a pod's CPU limit): the policy's min_cpu
CALIBRATE_S = 4.0
BAR = ("through the agents: the Planner adds capacity during the load step (cores in place, then replicas) "
       "and takes it back after it, 0 flaps (a direction change beyond that one up -> down), every plan applied "
       "by the Executor, the service ends on its minimum replicas, 0 failed requests")


def phases(quick: bool) -> tuple[float, float, float]:
    """(low before the step, the step, the most to wait after it for the scale-down), seconds."""
    return (4.0, 20.0, 60.0) if quick else (8.0, 30.0, 90.0)


UP_MOVES, DOWN_MOVES = ("up", "grow"), ("down", "shrink")  # replicas or cores per replica


def direction(action: str) -> str:
    """Pure: 'up' for a move that adds capacity (a replica, or cores in place), 'down' for one that removes it."""
    return "up" if action in UP_MOVES else "down" if action in DOWN_MOVES else "hold"


def flaps(directions: Sequence[str]) -> int:
    """Pure: direction changes among capacity moves ('up' / 'down', or the actions themselves: grow counts
    as up, shrink as down) beyond the one the step asks for (up, then down). [up, up, down] -> 0;
    [up, down, up] -> 1; [down, up] -> 1; [grow, up, shrink, down] -> 0."""
    dirs = [direction(d) for d in directions]
    changes = sum(1 for a, b in itertools.pairwise(dirs) if a != b)
    expected = 1 if dirs and dirs[0] == "up" and "down" in dirs else 0
    return changes - expected


def scale_moves(plans: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    """Pure: the Planner's autoscale decisions since `since` (wall time) that changed the capacity: the
    replica count (up/down) or the cores per replica (grow/shrink, vertical-first)."""
    return [p for p in plans if p.get("policy") == "autoscale" and float(p.get("at") or 0.0) >= since
            and p.get("action") in UP_MOVES + DOWN_MOVES]


def plans_expected(moves: list[dict[str, Any]]) -> int:
    """Pure: how many plans the Executor must have applied for these moves: one `resources` plan per move
    that changed the cores, one `scale` plan per move that changed the replicas."""
    return sum(int(p.get("cpu") is not None and p.get("current_cpu") is not None
                   and abs(float(p["cpu"]) - float(p["current_cpu"])) > 1e-9)
               + int(p.get("replicas") is not None and p.get("current") is not None
                     and int(p["replicas"]) != int(p["current"])) for p in moves)


def executions(decisions: list[dict[str, Any]], since: float) -> tuple[int, int]:
    """Pure: (applied, failed) among the Executor's scale and resources executions since `since`: applied
    when every step of it succeeded (a resources plan: applied and read back)."""
    fired = [d for d in decisions if d.get("strategy") in ("execute-scale", "execute-resources")
             and d.get("result") == "fired" and float(d.get("at") or 0.0) >= since]
    ok = sum(1 for d in fired if (d.get("outcomes") or {})
             and all(o.get("status") == "ok" for o in d["outcomes"].values()))
    return ok, len(fired) - ok


OPT_OUT = "SCANFLOW_DEMO_S2"  # "inprocess": the in-process S2 even where the agents could run it


def run(ctx: DemoContext) -> ScenarioResult:
    """S2 through the agents (the default; its runs: docs/benchmarks/scenarios.md), or in-process with
    SCANFLOW_DEMO_S2=inprocess, without a running stack, or (in `_through_agents`) where per-replica CPU
    limits cannot be applied."""
    from scanflow.demo import s2_inprocess

    if os.environ.get(OPT_OUT) == "inprocess":
        return s2_inprocess.run(ctx, f"in-process as asked ({OPT_OUT}=inprocess)")
    if ctx.stack is None:
        return s2_inprocess.run(ctx, "the embedded stack (agents) is not running")
    return _through_agents(ctx)


def _through_agents(ctx: DemoContext) -> ScenarioResult:
    from scanflow.agentkit.env import primary_service
    from scanflow.demo import s2_inprocess

    res = ScenarioResult("s2", "autoscale", BAR)
    stack = ctx.stack
    svc = primary_service(stack.workflow)
    url = stack.service_url
    declared = svc.resources.model_dump(mode="json")
    serving = start_declared(stack, svc, url)
    if serving != svc.replicas:
        res.error = f"the service did not come back to its declared {svc.replicas} replicas (gateway: {serving})"
        return res
    ctx.say(f"S2: CPU limit {REPLICA_CPU} core per replica through the Executor")
    try:  # the Executor reads the limit back from the replica's cgroup: it fails where none applies
        change = run_executor_actuator(stack, "set_resources", {"service": svc.name, "threads": 1,
                                                    "resources": {**declared, "cpu": REPLICA_CPU}})
    except RuntimeError as exc:
        change = {"verified": False, "notes": [str(exc)]}
    reps_now = limited_replicas(stack.get("executor", "/services"), svc.name)
    if not change.get("verified") or not reps_now or reps_now[0].get("cpu_quota") is None:
        restore_declared(stack, svc, declared)
        why = "; ".join(change.get("notes") or []) or f"cgroup CPU limits not applied ({change.get('method')})"
        return s2_inprocess.run(ctx, why)
    low_s, high_s, wait_down = phases(ctx.quick)
    t_series: list[float] = []
    p99s: list[float | None] = []
    reps: list[int] = []
    load_rps: list[float] = []
    slo, wall0, plan = SLO_MS, time.time(), Rates(0.0, 0.0, 0.0)
    points: list[tuple[float, float, float | None]] = []
    first_ramp: list[tuple[float, float, float | None]] = []  # the ramp at REPLICA_CPU when fitted_cpu moved it
    replica_cpu = REPLICA_CPU
    base: list[float] = []
    seconds: list[Second] = []
    try:
        with OpenLoad(url, traffic_rows(ctx), ctx.home / "s2") as load:
            pid = int(reps_now[0]["pid"])
            ctx.say("S2: calibrating one replica's capacity at its CPU limit (a rate ramp)")
            # CPU-bound capacity (slo inf): the Planner now sees an overload in the observed rate x CPU per
            # request, and on a busy machine the p99 broke 50 ms at 26 rps while the replica used half its
            # quota at 66 rps (the step to 64 rps was then no overload: no move at all, e2e run 4 of 5)
            points = calibrate(load, url, pid, replica_cpu, slo_ms=math.inf)
            smaller = fitted_cpu(points, replica_cpu)
            if smaller is not None and smaller < replica_cpu:
                cap_now = capacity(points, replica_cpu, slo_ms=math.inf) or 0.0
                ctx.say(f"S2: one replica serves ~{cap_now:.0f} rps at {replica_cpu} core: a {HIGH_FRACTION}x step "
                        f"is beyond the {MAX_RATE:.0f} rps the generator sends here; limit {smaller} core, "
                        "calibrating again")
                load.rate(0)
                run_executor_actuator(stack, "set_resources", {"service": svc.name, "threads": 1,
                                                   "resources": {**declared, "cpu": smaller}})
                replica_cpu, first_ramp = smaller, points
                pid = int(limited_replicas(stack.get("executor", "/services"), svc.name)[0]["pid"])
                points = calibrate(load, url, pid, replica_cpu, slo_ms=math.inf)
            got = rates(capacity(points, replica_cpu, slo_ms=math.inf))
            if got is None:
                res.error = f"calibration failed: ramp {points}"
                return res
            plan = got
            load.rate(plan.low)
            time.sleep(1.0)  # back to the low rate: not measured
            base = gateway_p99s(url, CALIBRATE_S)
            slo = calibrated_slo(median(base), planner_latency_low(stack), max(base, default=None))
            set_slo = agent_request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": slo}})
            # under the policy's smallest size (fitted_cpu): the Planner's floor and step follow, so it
            # can take the cores back to where the scenario started after the step
            floor = {"min_cpu": replica_cpu, "cpu_step": replica_cpu} if replica_cpu < REPLICA_CPU else {}
            added = agent_request(stack, "POST", "planner", "/strategies", autoscale_strategy(**floor))
            if set_slo.status_code != 200 or added.status_code != 201:
                res.error = (f"could not set the SLO ({set_slo.status_code}) or turn the Planner's autoscale on "
                             f"({added.status_code}): {added.text[:200]}")
                return res
            ctx.say(f"S2: one replica ~{plan.capacity:.0f} rps at {replica_cpu} core; SLO {slo:.0f} ms; "
                    f"load {plan.low:.0f} -> {plan.high:.0f} -> {plan.low:.0f} rps")
            load.rate(plan.low)
            wall0 = time.time()
            start = time.monotonic()
            step_at, fall_at = start + low_s, start + low_s + high_s
            end = fall_at + wait_down
            down_seen_at: float | None = None
            stepped = fell = False
            while (now := time.monotonic()) < end:
                if not stepped and now >= step_at:
                    load.rate(plan.high)
                    stepped = True
                if not fell and now >= fall_at:
                    load.rate(plan.low)
                    fell = True
                n = serving_replicas(url)
                last = load.seconds(now - 1.5)
                t_series.append(round(now - start, 2))
                p99s.append(last[-1].p99_ms if last else None)
                load_rps.append(plan.high if step_at <= now < fall_at else plan.low)
                reps.append(n if n is not None else (reps[-1] if reps else svc.replicas))
                ctx.say(f"S2: t={now - start:.0f}s {load_rps[-1]:.0f} rps, p99 {p99s[-1] or 0:.0f} ms, "
                        f"replicas {reps[-1]}")
                if now >= fall_at and reps[-1] <= svc.min_replicas and max(reps) > svc.min_replicas:
                    down_seen_at = down_seen_at or now
                    if now - down_seen_at >= 3.0:  # a few more seconds at the minimum: a flap would show
                        break
                time.sleep(max(0.0, now + 1.0 - time.monotonic()))
            load.rate(0)
            wait_for(lambda: not load.seconds(time.monotonic() - 1.5) or load.seconds()[-1].in_flight == 0, 15.0)
            seconds = load.seconds(wall_to_mono(wall0))
    finally:
        agent_request(stack, "DELETE", "planner", f"/strategies/{STRATEGY}")
        agent_request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": None}})
        restore_declared(stack, svc, declared)
    ramp_text = " ".join(f"{r:.0f}rps:{c:.2f}cpu:{p or 0:.0f}ms" for r, c, p in points)
    if first_ramp:
        ramp_text = (f"at {REPLICA_CPU}: " + " ".join(f"{r:.0f}rps:{c:.2f}cpu" for r, c, _ in first_ramp)
                     + f"; at {replica_cpu}: {ramp_text}")
    step_wall, fall_wall = wall0 + low_s, wall0 + low_s + high_s
    plans = scale_moves(list(stack.get("planner", "/plans")), wall0)
    fired = [d for d in stack.decisions("planner", limit=1000)
             if d.get("strategy") == STRATEGY and d.get("result") == "fired" and float(d.get("at") or 0) >= wall0]
    exec_decisions = stack.decisions("executor", limit=1000)
    applied, exec_failed = executions(exec_decisions, wall0)
    executed = [d for d in exec_decisions if d.get("strategy") in ("execute-scale", "execute-resources")
                and d.get("result") == "fired" and float(d.get("at") or 0) >= wall0]
    directions = [str(p["action"]) for p in plans]
    ups = [p for p in plans if direction(p["action"]) == "up" and step_wall <= float(p["at"]) <= fall_wall + 2.0]
    downs = [p for p in plans if direction(p["action"]) == "down" and float(p["at"]) > fall_wall]
    final_plan = [p for p in stack.get("planner", "/plans") if p.get("policy") == "autoscale"][-1:]
    requests = sum(s.sent for s in seconds)
    failed = sum(s.failed for s in seconds)
    unsent = sum(s.unsent for s in seconds)
    res.decisions = [f"t={float(p['at']) - wall0:.0f}s {p['action']} replicas {p.get('current')}->{p.get('replicas')}"
                     f" cpu {p.get('current_cpu')}->{p.get('cpu')}: {str(p.get('reason', ''))[:70]}" for p in plans]
    res.decisions += [f"last decision: {str(lp.get('reason', ''))[:160]}" for lp in final_plan]  # why it stopped there
    high_p99 = [p for p, r in zip(p99s, load_rps, strict=True) if r == plan.high and p is not None]
    sim = compare(Trace(), SimConfig(slo_ms=SLO_MS, max_replicas=8))
    pf, hf = sim["planner"].figures(), sim["hpa"].figures()
    res.figures = {
        "mode": "agents", "requests": requests, "failed": failed, "unsent": unsent,
        "max_replicas": max(reps, default=0), "final_replicas": reps[-1] if reps else None,
        "scale_up_after_s": round(float(ups[0]["at"]) - step_wall, 1) if ups else None,
        "scale_down_after_s": round(float(downs[0]["at"]) - fall_wall, 1) if downs else None,
        "planner_moves": len(plans), "flaps": flaps(directions), "replica_reversals": reversals(reps),
        "latency_events_acted_on": len(fired), "executor_scale_actions": len(executed),
        "executor_applied": applied, "executor_failed": exec_failed, "plans_expected": plans_expected(plans),
        "grow_moves": sum(1 for p in plans if p["action"] in ("grow", "shrink")),
        "p99_high_first_ms": high_p99[0] if high_p99 else None, "p99_high_last_ms": high_p99[-1] if high_p99 else None,
        # the calibration: one replica's capacity at its CPU limit, measured at the start of this run
        "baseline_p99s_ms": " ".join(f"{b:.0f}" for b in base), "replica_cpu": replica_cpu, "capacity_rps": plan.capacity, "calibration": ramp_text, "low_rps": plan.low, "high_rps": plan.high,
        "slo_ms": slo, "declared_slo_ms": svc.slo.latency_ms if svc.slo else None,
        # simulation (scanflow.demo.sim), not this run: the same policy vs the HPA algorithm on one trace
        "sim_planner_slo_violation_s": pf["slo_violation_s"], "sim_hpa_slo_violation_s": hf["slo_violation_s"],
        "sim_planner_replica_s": pf["replica_s"], "sim_hpa_replica_s": hf["replica_s"],
        "sim_planner_reversals": pf["reversals"], "sim_hpa_reversals": hf["reversals"],
        "sim_planner_core_s": pf["core_s"], "sim_hpa_core_s": hf["core_s"], "sim_planner_flaps": pf["flaps"],
    }
    res.passed = (bool(ups) and bool(downs) and flaps(directions) == 0 and bool(reps)
                  and reps[-1] == svc.min_replicas and failed == 0 and unsent == 0
                  and applied >= plans_expected(plans) and exec_failed == 0)
    res.series = {"t": t_series, "p99": p99s, "replicas": reps, "clients": load_rps,
                  "sim": {k: (v.t, v.cores, v.latency_ms) for k, v in sim.items()},
                  "slo_ms": slo, "sim_slo_ms": SLO_MS}
    return res


def wall_to_mono(wall: float) -> float:
    """A time.time() instant on the time.monotonic() clock (the generator reports monotonic times)."""
    return time.monotonic() - (time.time() - wall)
