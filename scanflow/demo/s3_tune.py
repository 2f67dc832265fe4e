"""S3 tune through the agents: the Planner sizes the service's replica from what the Checker observes.

Two cases on the running EmbeddedStack, the same open-loop load in both:
1. mis-sized: the Executor holds the replica to MIS_CPU (0.1) of a core and one thread (`set_resources`,
   read back from its cgroup), on a machine with a second core. A rate ramp measures what it serves at that
   size (`s2_stack.calibrate`); the load then runs at LOAD_FACTOR times that. The Planner's
   autoscale strategy (vertical-first: a saturated, throttled replica grows in place) is turned on
   over REST. Passes only if the chain happened: the Planner decided `grow` on the Checker's
   observations (GET /plans: its inputs), the Executor's `execute-resources` fired and its
   `set_resources` read the change back (GET /decisions), the replica now runs with the cores the
   plan asked for (GET /services), the measured throughput rose by at least GAIN_MIN (a closed-loop
   capacity probe, 8 connections back to back, before the Planner was on and after its change: an open
   loop cannot show it, a mis-sized replica that keeps up with the offered rate at a higher latency
   serves the same answers per second), and no move reversed another on the steady load (the
   Planner's own flap counter, `flaps_since`).
2. right-sized: once the Planner settled in case 1 (`settled`: no move for 15 s, no shrink pending), the
   service starts at the size whose hold band best fits the needs it observed (`right_size`), under
   the load that size is right for (`right_rate`: the observed need per request/s put in the middle of
   that band, within 2x of case 1's load); passes only if nothing changed: the
   Planner looked (autoscale decisions were made on observations during the window) and held, the Executor changed neither resources nor replicas, and the load was served.
Afterwards the strategy is removed, the SLO override cleared and the declared resources and replica
count restored. No stack (agents) or no cgroup CPU quota: the scenario reports why and does not pass.
Who calls: scanflow.demo.runner; tests/e2e/test_s3_tune.py.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from scanflow.demo.common import DemoContext, traffic_rows, wait_for
from scanflow.demo.load import OpenLoad
from scanflow.demo.report import ScenarioResult
from scanflow.demo.s2_capacity import MAX_RATE, calibrated_slo, capacity, median
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
)
from scanflow.loadgen_engine import Second

# cores: the mis-sized start (a CFS quota), with one thread. Not 0.3: the gateway batches requests, so a
# replica of the digits model costs little per request, and at 0.3 of a core it served 400 rps (the most
# the generator sends here), the load never saturated it and no gain could be measured
MIS_CPU = 0.1
LOAD_FACTOR = 2.0  # the load, in multiples of what the mis-sized replica serves
GAIN_MIN = 0.3  # probed capacity after the change / before - 1 that counts as a gain
BEFORE_S = 4.0  # seconds of the mis-sized replica under the load, measured before the strategy is on
PROBE_S = 4.0  # seconds of each closed-loop capacity probe (before the Planner, after its change)
PROBE_CONNECTIONS = 8  # the probe's connections back to back
SETTLE_S = 2.0  # after the change, before measuring: the backlog of the mis-sized phase drains
SETTLED_S = 15.0  # no move of the Planner for this long: it settled (its shrink waits 3 ticks + a 6 s cooldown)
SETTLED_LOOKS = 4  # ... and its last this many decisions held with no shrink pending
SETTLE_WAIT_S = 90.0  # the most to wait for that
DECIDE_S = 60.0  # the most to wait for the Planner's grow and the Executor's change (docs/benchmarks/constants.md)
RIGHT_S = 20.0  # the right-sized case's window: long enough for several of the Checker's ticks
MIN_LOOKS = 3  # autoscale decisions the Planner must have made in the right-sized window
RIGHT_RATE_SPAN = 2.0  # case 2's load stays within this factor of case 1's (`right_rate`)
MOVES = ("grow", "shrink", "up", "down")
BAR = (f"through the agents: from {MIS_CPU} core the Planner grows the replica on the Checker's observations, "
       f"the Executor applies it and reads it back, throughput +{GAIN_MIN:.0%} or more, no reversal (0 flaps); "
       "started right-sized, nothing changes; 0 failed requests")


@dataclass(frozen=True)
class Chain:
    """What the audit logs hold of one case (pure data, from `chain`)."""

    moves: list[dict[str, Any]]  # the Planner's autoscale decisions that changed something
    looks: int  # every autoscale decision (held ones included)
    resources_ok: list[dict[str, Any]]  # the Executor's execute-resources that fired, every step ok
    resources_failed: int  # ... that fired with a failed step (e.g. read back differs)
    scales: int  # the Executor's execute-scale that fired


def chain(plans: list[dict[str, Any]], decisions: list[dict[str, Any]], since: float) -> Chain:
    """Pure: the Planner's autoscale decisions and the Executor's resources/scale executions since
    `since` (wall time)."""
    auto = [p for p in plans if p.get("policy") == "autoscale" and float(p.get("at") or 0.0) >= since]
    fired = [d for d in decisions if d.get("result") == "fired" and float(d.get("at") or 0.0) >= since]
    res = [d for d in fired if d.get("strategy") == "execute-resources"]

    def ok(d: dict[str, Any]) -> bool:
        outs = (d.get("outcomes") or {}).values()
        return bool(outs) and all(o.get("status") == "ok" for o in outs)

    return Chain([p for p in auto if p.get("action") in MOVES], len(auto), [d for d in res if ok(d)],
                 sum(1 for d in res if not ok(d)), sum(1 for d in fired if d.get("strategy") == "execute-scale"))


def served(seconds: list[Second], t0: float, t1: float) -> float | None:
    """Pure: answers per second (ok) in the generator's reports within [t0, t1) (monotonic)."""
    got = [s for s in seconds if t0 <= s.t < t1]
    return sum(s.ok for s in got) / len(got) if got else None


def flaps_since(plans: list[dict[str, Any]], since: float) -> int:
    """Pure: flaps the Planner counted (its autoscale decisions' `flaps`, cumulative in its state) since
    `since`: moves that reversed the previous one on a steady load (scanflow.policies.elastic)."""
    auto = sorted((p for p in plans if p.get("policy") == "autoscale"), key=lambda p: float(p.get("at") or 0.0))

    def count(p: dict[str, Any]) -> int:
        return int((p.get("inputs") or {}).get("flaps") or 0)

    before = [count(p) for p in auto if float(p.get("at") or 0.0) < since]
    after = [count(p) for p in auto if float(p.get("at") or 0.0) >= since]
    return max(after, default=0) - (before[-1] if before else 0) if after else 0


def mis_sized_verdict(c: Chain, grown_cpu: float | None, quota_now: float | None, before: float | None,
                      after: float | None, flaps: int = 0) -> tuple[bool, float | None]:
    """Pure: (passed, gain). The chain must show a grow decided by the Planner, executed by the Executor
    with its read-back ok and nothing failed, the replica must run with the cores the plan asked for,
    the throughput must have risen by GAIN_MIN, and no move may have reversed another (`flaps`)."""
    gain = after / before - 1.0 if before and after is not None else None
    grew = bool(c.moves) and c.moves[0].get("action") == "grow" and grown_cpu is not None and grown_cpu > MIS_CPU
    # grown_cpu: the cores of the Planner's last move (it may grow twice and shrink back before settling)
    applied = bool(c.resources_ok) and c.resources_failed == 0
    runs = quota_now is not None and grown_cpu is not None and abs(quota_now - grown_cpu) <= 0.011
    return grew and applied and runs and gain is not None and gain >= GAIN_MIN and flaps == 0, gain


def settled(plans: list[dict[str, Any]], since: float, now: float) -> bool:
    """Pure: the Planner settled on a size for this load: no move for SETTLED_S, and its last
    SETTLED_LOOKS autoscale decisions since the last move held with no shrink pending (a shrink waits for
    agreeing ticks: a size held for a while with a shrink 2 ticks of 3 along is not a fixed point, and
    case 2 would start from it and see the shrink)."""
    auto = [p for p in plans if p.get("policy") == "autoscale" and float(p.get("at") or 0.0) >= since]
    moves = [i for i, p in enumerate(auto) if p.get("action") in MOVES]
    if moves and now - float(auto[moves[-1]]["at"]) < SETTLED_S:
        return False
    after = auto[moves[-1] + 1:] if moves else auto
    last = after[-SETTLED_LOOKS:]
    return len(last) == SETTLED_LOOKS and all(
        p.get("action") == "hold" and not (p.get("inputs") or {}).get("shrink_pending") for p in last)


def right_size(plans: list[dict[str, Any]], config: Any) -> float | None:
    """Pure: the cores per replica that are right-sized for the load the Planner's last SETTLED_LOOKS
    decisions (`plans`) observed: the size, in `cpu_step` multiples, whose hold band (`elastic.hold_band`)
    holds every observed per-replica need with the widest margin to both of its edges. The top edge is
    taken at `saturated_utilization` of the size where that is lower, since a replica that uses that much
    of its limit counts as saturated. Case 2 keeps case 1's load: no extrapolation, because a request's
    CPU changes with the rate and batches fill differently.

    Why not the size it settled on: that may sit at an edge of its band (a 0.25-core replica holding
    with its need near 0.25, throttled now and then) and then moves on noise alone. Why not where its
    own shrink would land (`shrink_to` of the largest need): the quantisation can round that up to a size
    whose shrink edge the need only just clears. A CI run measured needs of 0.17 at 0.5 core (shrink edge
    0.167), then 0.16 in case 2, which shrank it. With no size holding every need, the shrink's landing
    is used; None without an observed need."""
    from scanflow.policies import elastic

    needs = [n for n in (steady_need(p, config) for p in plans[-SETTLED_LOOKS:]) if n is not None]
    if not needs:
        return None
    low, high = min(needs), max(needs)
    best: tuple[float, float] | None = None  # (margin, size)
    size = config.min_cpu
    while size <= max(config.min_cpu, elastic.shrink_to(high, config) * 2):
        lo, hi = elastic.hold_band(size, config)
        hi = min(hi, size * config.saturated_utilization)
        margin = min(low / lo if lo > 0 else math.inf, hi / high)
        if margin > 1 and (best is None or margin > best[0]):
            best = (margin, size)
        size = round(size + config.cpu_step, 9)
    return best[1] if best is not None else elastic.shrink_to(high, config)


def right_rate(plans: list[dict[str, Any]], size: float, replicas: int, config: Any, rate: float) -> float:
    """Pure: the offered rate (requests/s) at which `replicas` replicas of `size` cores are right-sized: the
    one that puts the per-replica need the Planner observed (its last SETTLED_LOOKS decisions, as cores per
    request/s) at the geometric middle of that size's hold band (`elastic.hold_band`, its top edge at
    `saturated_utilization` of the size where lower). Within [rate, rate * RIGHT_RATE_SPAN] and MAX_RATE;
    `rate` itself when nothing was observed.

    Why move the load at all: the needs one load produces spread tick to tick (0.16-0.25 cores at 0.5 core in
    one CI run), and at some loads they straddle the shrink edge of one size and the grow edge of the size
    under it. No size is right for such a load (the policy would reverse itself there too, after its flap
    window), so case 2 picks the load a size is right for instead of a size for a load no size fits."""
    from scanflow.policies import elastic

    per_rps = sorted(n * max(1, int(p.get("current") or 1)) / float(p["inputs"]["arrival_rate"])
                     for p in plans[-SETTLED_LOOKS:]
                     if (n := steady_need(p, config)) is not None and (p.get("inputs") or {}).get("arrival_rate"))
    if not per_rps:
        return rate
    lo, hi = elastic.hold_band(size, config)
    hi = min(hi, size * config.saturated_utilization)
    middle = math.sqrt(lo * hi) if lo > 0 else hi / 2  # no shrink below this size: half its top edge
    cores_per_rps = per_rps[len(per_rps) // 2]  # the median look
    want = middle * max(1, replicas) / cores_per_rps
    # never below case 1's load: a request costs more CPU at a lower rate (fewer share a batch), so a
    # lowered load reads a need the extrapolation did not foresee (a CI run: 112 -> 65 rps, and shrank)
    return round(min(MAX_RATE, rate * RIGHT_RATE_SPAN, max(rate, want)), 1)


def steady_need(plan: dict[str, Any], config: Any) -> float | None:
    """Pure: the cores per replica one autoscale decision's observations ask for at a steady load: the
    arrival rate times the measured CPU per request, at `target_utilization`, without the backlog term
    of the Planner's own need (requests in flight drained within drain_s, which a gateway's batches keep
    high and noisy, and which inflated case 1's needs in a CI run). The Planner's `need_cores` when the
    CPU per request was not measured."""
    inputs = plan.get("inputs") or {}
    replicas = max(1, int(plan.get("current") or 1))
    rate, cost = inputs.get("arrival_rate"), inputs.get("cpu_per_request_ms")
    if rate and cost:
        return float(rate) * float(cost) / 1000.0 / config.scale.target_utilization / replicas
    return float(inputs["need_cores"]) / replicas if inputs.get("need_cores") else None


def _elastic_config() -> Any:
    """The vertical knobs of the workflow's autoscale settings (those that shape where a shrink lands)."""
    from scanflow.examples.digits.workflow import workflow
    from scanflow.policies import elastic

    planner = next(a for a in workflow.agents if a.role == "planner")
    auto = dict(planner.settings.get("autoscale", {}))
    config = elastic.ElasticConfig()
    # the demand's headroom too (steady_need divides by it), as the Planner reads it from the workflow
    scale = replace(config.scale, target_utilization=float(auto.get("target_utilization",
                                                                     config.scale.target_utilization)))
    return replace(config, scale=scale, min_cpu=float(auto.get("min_cpu", config.min_cpu)),
                   cpu_step=float(auto.get("cpu_step", config.cpu_step)),
                   shrink_headroom=float(auto.get("shrink_headroom", config.shrink_headroom)))


def right_sized_verdict(c: Chain, offered: float, got: float | None) -> bool:
    """Pure: nothing changed although the Planner looked, and the load was served (90% of the offered rate)."""
    return (not c.moves and c.looks >= MIN_LOOKS and not c.resources_ok and not c.resources_failed
            and c.scales == 0 and got is not None and got >= 0.9 * offered)


def capacity_probe(load: OpenLoad, seconds: float = PROBE_S) -> float | None:
    """What the service serves now with PROBE_CONNECTIONS back to back (a closed loop: its throughput is
    the service's capacity, whatever an open-loop rate would offer), answers per second over the probe
    after its first second; the load is left idle."""
    load.closed(PROBE_CONNECTIONS)
    t0 = time.monotonic()
    time.sleep(seconds)  # the probe's measurement window, not a synchronisation
    got = served(load.seconds(), t0 + 1.0, time.monotonic())
    load.rate(0)
    time.sleep(0.5)  # the probe's requests drain: not measured
    return got


def _quota(stack: Any, service: str) -> float | None:
    reps = [r for r in limited_replicas(stack.get("executor", "/services"), service) if r.get("ready")]
    return reps[0].get("cpu_quota") if reps else None


def _threads_for(cpu: float) -> int:
    return max(1, int(cpu + 1e-9))


def run(ctx: DemoContext) -> ScenarioResult:
    from scanflow.agentkit.env import primary_service

    res = ScenarioResult("s3", "tune", BAR)
    stack = ctx.stack
    if stack is None:
        res.error = "the embedded stack (agents) is not running: S3 is the agents' decision"
        return res
    svc = primary_service(stack.workflow)
    url = stack.service_url
    declared = svc.resources.model_dump(mode="json")
    ctx.say(f"S3: mis-sized start: {MIS_CPU} core, 1 thread, through the Executor")
    try:
        run_executor_actuator(stack, "set_resources", {"service": svc.name, "threads": 1,
                                           "resources": {**declared, "cpu": MIS_CPU}})
    except RuntimeError as exc:
        restore_declared(stack, svc, declared)
        res.error = f"the mis-sized start could not be applied (no CPU quota here?): {exc}"[:400]
        return res
    figures: dict[str, Any] = {"mis_cpu": MIS_CPU}
    passed_mis = passed_right = False
    try:
        with OpenLoad(url, traffic_rows(ctx), ctx.home / "s3") as load:
            reps = limited_replicas(stack.get("executor", "/services"), svc.name)
            pid = int(reps[0]["pid"])
            points = calibrate(load, url, pid, MIS_CPU, slo_ms=math.inf)  # CPU-bound: see `calibrate`
            cap = capacity(points, MIS_CPU, slo_ms=math.inf)
            figures["calibration"] = " ".join(f"{r:.0f}rps:{c:.2f}cpu:{p or 0:.0f}ms" for r, c, p in points)
            if cap is None:
                res.error = f"calibration failed: ramp {points}"
                return res
            rate = round(min(MAX_RATE, LOAD_FACTOR * cap), 1)
            load.rate(max(5.0, cap / 4))
            time.sleep(1.0)  # the low rate settles: not measured
            base = gateway_p99s(url, 3.0)
            slo = calibrated_slo(median(base), planner_latency_low(stack), max(base, default=None))
            set_slo = agent_request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": slo}})
            ctx.say(f"S3: {MIS_CPU} core serves ~{cap:.0f} rps; load {rate:.0f} rps; SLO {slo:.0f} ms")
            # case 1: what the mis-sized replica can serve (closed loop), then the load and the Planner on
            t_load = time.monotonic()
            before = capacity_probe(load)
            load.rate(rate)
            time.sleep(BEFORE_S)  # the mis-sized replica under the open-loop load before the Planner looks
            wall1 = time.time()
            added = agent_request(stack, "POST", "planner", "/strategies", autoscale_strategy())
            if set_slo.status_code != 200 or added.status_code != 201:
                res.error = f"could not set the SLO ({set_slo.status_code}) or turn the Planner's autoscale on " \
                            f"({added.status_code}): {added.text[:200]}"
                return res

            def grown() -> Chain | None:
                c = chain(list(stack.get("planner", "/plans")), stack.decisions("executor", limit=1000), wall1)
                return c if c.resources_ok or c.resources_failed else None

            got: Chain | None = None

            def applied() -> bool:
                nonlocal got
                got = grown()
                return got is not None

            wait_for(applied, DECIDE_S, interval_s=0.5)

            figures["settled"] = wait_for(lambda: settled(list(stack.get("planner", "/plans")), wall1, time.time()),
                                          SETTLE_WAIT_S, interval_s=0.5)
            c1 = chain(list(stack.get("planner", "/plans")), stack.decisions("executor", limit=1000), wall1)
            agent_request(stack, "DELETE", "planner", f"/strategies/{STRATEGY}")  # the probe's burst is not traffic
            after = capacity_probe(load)  # what the service serves now, as it was before the change
            # the cores the Planner last asked for (it may grow twice, x1.5 while latency is over, and shrink)
            grown_cpu = float(c1.moves[-1].get("cpu") or 0.0) if c1.moves else None
            quota_now = _quota(stack, svc.name)
            flaps_mis = flaps_since(list(stack.get("planner", "/plans")), wall1)
            passed_mis, gain = mis_sized_verdict(c1, grown_cpu, quota_now, before, after, flaps_mis)
            res.decisions += [f"mis-sized: t={float(p['at']) - wall1:.0f}s {p.get('action')} cpu "
                              f"{p.get('current_cpu')}->{p.get('cpu')}, replicas {p.get('current')}->"
                              f"{p.get('replicas')}: {str(p.get('reason', ''))[:60]}" for p in c1.moves]
            figures.update({
                "capacity_rps": cap, "load_rps": rate, "slo_ms": slo, "before_rps": before, "after_rps": after,
                "gain": None if gain is None else round(gain, 3), "grown_cpu": grown_cpu, "cpu_quota_now": quota_now,
                "planner_moves": len(c1.moves), "flaps": flaps_mis, "executor_resources_ok": len(c1.resources_ok),
                "executor_resources_failed": c1.resources_failed,
                "decided_after_s": round(float(c1.moves[0]["at"]) - wall1, 1) if c1.moves else None,
            })
            # case 2: started right-sized, under the load that size is right for: nothing may change.
            # Right-sized = the size whose band best fits the needs the Planner observed once settled in
            # case 1 (`right_size`), at the replica count it settled on, the load moved so that need sits
            # in the middle of that band (`right_rate`). Not its first grow (the latency rule
            # overshoots: 0.1 -> 0.5 -> 0.75, then shrunk), nor the size it settled on when that sits at
            # an edge of its band.
            auto1 = [p for p in stack.get("planner", "/plans")
                     if p.get("policy") == "autoscale" and float(p.get("at") or 0.0) >= wall1]
            right = min(right_size(auto1, _elastic_config()) or quota_now or MIS_CPU, float(os.cpu_count() or 1))
            right_replicas = len([r for r in limited_replicas(stack.get("executor", "/services"), svc.name)
                                  if r.get("ready")]) or 1
            run_executor_actuator(stack, "set_resources", {"service": svc.name, "threads": _threads_for(right),
                                               "resources": {**declared, "cpu": right}})
            run_executor_actuator(stack, "scale", {"service": svc.name, "replicas": right_replicas})
            rate2 = right_rate(auto1, right, right_replicas, _elastic_config(), rate)
            load.rate(rate2)
            time.sleep(SETTLE_S)  # the resize settles before the window: not measured
            wall2, t2 = time.time(), time.monotonic()
            agent_request(stack, "POST", "planner", "/strategies", autoscale_strategy())
            time.sleep(RIGHT_S)  # the right-sized window: the Planner observes, nothing should change
            c2 = chain(list(stack.get("planner", "/plans")), stack.decisions("executor", limit=1000), wall2)
            got2 = served(load.seconds(), t2 + 1.0, time.monotonic())
            passed_right = right_sized_verdict(c2, rate2, got2)
            res.decisions += [f"right-sized: {p.get('action')} cpu {p.get('current_cpu')}->{p.get('cpu')}: "
                              f"{str(p.get('reason', ''))[:60]}" for p in c2.moves]
            load.rate(0)
            seconds = load.seconds(t_load)
            figures.update({
                "settled_cpu": quota_now, "right_cpu": right, "right_replicas": right_replicas, "right_load_rps": rate2, "right_rps": got2, "right_looks": c2.looks,
                "right_moves": len(c2.moves),
                "right_flaps": flaps_since(list(stack.get("planner", "/plans")), wall2),
                "right_executor_changes": len(c2.resources_ok) + c2.resources_failed + c2.scales,
                "failed": sum(s.failed for s in seconds), "unsent": sum(s.unsent for s in seconds),
            })
            start_label, grown_label = f"{MIS_CPU:g} core (start)", f"{quota_now or 0:g} core (grown)"
            res.series = {"measured": {start_label: before or 0.0, grown_label: after or 0.0,
                                       f"{right:g} core (right-sized, served)": got2 or 0.0},
                          "default": start_label, "chosen": grown_label,
                          "t": [round(s.t - t_load, 2) for s in seconds], "ok": [s.ok for s in seconds]}
    finally:
        agent_request(stack, "DELETE", "planner", f"/strategies/{STRATEGY}")
        agent_request(stack, "POST", "checker", "/actuators/set_slo", {"args": {"latency_ms": None}})
        restore_declared(stack, svc, declared)
    figures.update({"mis_sized_passed": passed_mis, "right_sized_passed": passed_right})
    res.figures = figures
    # nothing is killed here: a failed request is a failure of the scenario (the resizes, the probes)
    res.passed = passed_mis and passed_right and figures.get("failed") == 0
    return res
