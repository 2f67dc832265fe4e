"""S2 autoscaling benchmark: the Planner's autoscale policy vs the Kubernetes HPA algorithm.

A SIMULATION, not a load test: both controllers drive the same discrete-event queueing model of
inference replicas on the same arrival trace (Poisson, low -> high -> low step), same seeds, same
time-scale factor. Who runs it: people and CI (`python benchmarks/scaling.py --quick`).

Model (calibration in docs/policies.md):
- each replica is one core serving FIFO; a request costs a service time drawn from a gamma law with
  mean `--service-ms` (1 ms: measured here, ~1,000-1,300 one-row requests/s per server core)
  and coefficient of variation 0.5;
- the gateway sends each request to the replica with the least outstanding work (join-shortest-queue);
- a new replica serves after a start-up delay (10 s nominal: process start + model load) and at the
  first controller tick after it; a removed replica takes no new request and finishes its queue (no
  request fails) and costs replica-seconds until its queue is empty;
- the Planner's policy ticks every second (nominal) and sees the p99 latency of requests completed in
  the last tick, the requests in flight, the arrival rate and the mean service time; the HPA sees the
  average CPU utilization (busy time / time) of ready replicas over its sync period, target 70%;
- every duration (trace phases, start-up delay, controller periods and windows, tick) is divided by
  `--time-scale`, identically for both.

Figures per controller (median over seeds): SLO-violation seconds (1 s windows, by arrival time, whose
p99 latency exceeds the SLO), replica-seconds, flaps (a scale move followed by one in the opposite
direction within 60 s nominal), max replicas. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from scanflow.policies import autoscale, hpa

NOMINAL_TRACE = ((60.0, 600.0), (120.0, 3600.0), (360.0, 600.0))  # (seconds, requests/s)
STARTUP_S = 10.0
TICK_S = 1.0
FLAP_WINDOW_S = 60.0
VIOLATION_WINDOW_S = 1.0


@dataclass
class Metrics:
    """What a controller sees at the end of a tick."""

    now: float
    replicas: int
    ready: int
    p99_ms: float | None
    in_flight: float
    arrival_rate: float
    service_ms: float | None
    utilization: float  # over the controller's own averaging period


@dataclass
class RunResult:
    controller: str
    violation_s: float
    replica_s: float
    flaps: int
    max_replicas: int
    scale_events: list[tuple[float, int, int]] = field(default_factory=list)  # (time, from, to)
    timeline: list[tuple[float, int, float | None]] = field(default_factory=list)  # (t, replicas, p99)


Controller = Callable[[Metrics], int]


def make_planner(slo_ms: float, max_replicas: int, time_scale: float) -> Controller:
    # the policy's shipped defaults; only the bounds and the time scale are the benchmark's
    base = autoscale.AutoscaleConfig()
    cfg = replace(base, guardrails=replace(base.guardrails, min_replicas=1, max_replicas=max_replicas,
                                           time_scale=time_scale))
    state = autoscale.AutoscaleState()

    def step(m: Metrics) -> int:
        nonlocal state
        d, state = autoscale.decide(autoscale.AutoscaleContext(
            now=m.now, current_replicas=m.replicas, ready_replicas=m.ready, slo_latency_ms=slo_ms,
            latency_ms=m.p99_ms, in_flight=m.in_flight, arrival_rate=m.arrival_rate,
            service_time_ms=m.service_ms, config=cfg, state=state))
        return d.replicas

    return step


def make_hpa(max_replicas: int, time_scale: float) -> tuple[Controller, float]:
    cfg = hpa.HpaConfig(min_replicas=1, max_replicas=max_replicas, target=0.7, time_scale=time_scale)
    state = hpa.HpaState()

    def step(m: Metrics) -> int:
        nonlocal state
        d, state = hpa.decide(hpa.HpaContext(now=m.now, current_replicas=m.replicas, ready_replicas=m.ready,
                                             metric=m.utilization, config=cfg, state=state))
        return d.replicas

    return step, cfg.sync_period_s / time_scale


def make_trace(seed: int, time_scale: float, service_ms: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Arrival times (Poisson per phase) and service times (gamma, CV 0.5); the trace length."""
    rng = np.random.default_rng(seed)
    times, t0 = [], 0.0
    for dur, rate in NOMINAL_TRACE:
        d = dur / time_scale
        n = rng.poisson(rate * d)
        times.append(np.sort(rng.uniform(t0, t0 + d, n)))
        t0 += d
    arrivals = np.concatenate(times)
    shape = 4.0  # CV = 1/sqrt(shape) = 0.5
    service = rng.gamma(shape, service_ms / 1000.0 / shape, len(arrivals))
    return arrivals, service, t0


def simulate(controller: Controller, name: str, arrivals: np.ndarray, service: np.ndarray, end: float, *,
             slo_ms: float, time_scale: float, util_period_s: float) -> RunResult:
    tick = TICK_S / time_scale
    startup = STARTUP_S / time_scale
    n_ticks = math.ceil(end / tick)
    n_buckets = n_ticks + 10_000
    comp_lat: list[list[float]] = [[] for _ in range(n_buckets)]
    comp_svc = [0.0] * n_buckets
    busy = [0.0] * n_buckets
    ready_per_tick = [0] * n_buckets
    latency = np.empty(len(arrivals))

    # replicas: id -> [free_at, ready_at, created_at]; active = not removed
    reps: dict[int, list[float]] = {0: [0.0, 0.0, 0.0]}
    next_id = 1
    retired_s = 0.0  # replica-seconds of removed replicas
    scale_events: list[tuple[float, int, int]] = []
    timeline: list[tuple[float, int, float | None]] = []
    completed_before = 0  # completions before the current tick end
    i, n = 0, len(arrivals)
    util_ticks = max(1, round(util_period_s / tick))

    for k in range(n_ticks):
        t_end = (k + 1) * tick
        ready_ids = [rid for rid, r in reps.items() if r[1] <= k * tick]
        ready_per_tick[k] = len(ready_ids)
        heap = [(reps[rid][0], rid) for rid in ready_ids]
        heapq.heapify(heap)
        first = i
        while i < n and arrivals[i] < t_end:
            a, x = arrivals[i], service[i]
            f, rid = heap[0]
            start = max(f, a)
            done = start + x
            heapq.heapreplace(heap, (done, rid))
            latency[i] = done - a
            b = int(done / tick)
            comp_lat[b].append(done - a)
            comp_svc[b] += x
            busy[int(start / tick)] += x
            i += 1
        for f, rid in heap:
            reps[rid][0] = f
        arrived = i - first
        done_now = comp_lat[k]
        completed_before += len(done_now)
        p99 = float(np.percentile(done_now, 99)) * 1000.0 if done_now else None
        lo = max(0, k - util_ticks + 1)
        cap = sum(ready_per_tick[lo:k + 1]) * tick
        util = min(1.0, sum(busy[lo:k + 1]) / cap) if cap > 0 else 0.0
        m = Metrics(now=t_end, replicas=len(reps), ready=len(ready_ids), p99_ms=p99,
                    in_flight=float(i - completed_before), arrival_rate=arrived / tick,
                    service_ms=(comp_svc[k] / len(done_now) * 1000.0) if done_now else None,
                    utilization=util)
        target = controller(m)
        timeline.append((t_end, len(reps), p99))
        if target > len(reps):
            for _ in range(target - len(reps)):
                reps[next_id] = [t_end, t_end + startup, t_end]
                next_id += 1
        elif target < len(reps):
            # drop replicas still starting first, then the ones with the least queued work
            order = sorted(reps, key=lambda rid: (reps[rid][1] <= t_end, reps[rid][0]))
            for rid in order[: len(reps) - target]:
                free_at, _, created = reps.pop(rid)
                retired_s += max(t_end, free_at) - created
        if target != m.replicas:
            scale_events.append((t_end, m.replicas, target))

    final = n_ticks * tick
    replica_s = retired_s + sum(max(final, r[0]) - r[2] for r in reps.values())
    # SLO-violation seconds: 1 s windows (scaled like the rest) by arrival time whose p99 breaks the SLO
    win = VIOLATION_WINDOW_S / time_scale
    idx = (arrivals / win).astype(np.int64)
    bounds = np.flatnonzero(np.diff(idx)) + 1
    violated = sum(1 for chunk in np.split(latency, bounds) if len(chunk)
                   and np.percentile(chunk, 99) * 1000.0 > slo_ms)
    flaps = count_flaps(scale_events, FLAP_WINDOW_S / time_scale)
    return RunResult(name, violated * win, replica_s, flaps, max(max(f, t) for _, f, t in scale_events)
                     if scale_events else 1, scale_events, timeline)


def count_flaps(events: list[tuple[float, int, int]], window_s: float) -> int:
    """A move followed, within `window_s`, by a move in the opposite direction."""
    flaps = 0
    for (t1, a1, b1), (t2, a2, b2) in itertools.pairwise(events):
        if (b1 - a1) * (b2 - a2) < 0 and t2 - t1 < window_s:
            flaps += 1
    return flaps


def run(seeds: int, time_scale: float, service_ms: float, slo_ms: float, max_replicas: int) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {"planner": [], "hpa": []}
    for seed in range(seeds):
        arrivals, service, end = make_trace(seed, time_scale, service_ms)
        hpa_ctl, hpa_period = make_hpa(max_replicas, time_scale)
        out["planner"].append(simulate(make_planner(slo_ms, max_replicas, time_scale), "planner", arrivals,
                                       service, end, slo_ms=slo_ms, time_scale=time_scale,
                                       util_period_s=TICK_S / time_scale))
        out["hpa"].append(simulate(hpa_ctl, "hpa", arrivals, service, end, slo_ms=slo_ms,
                                   time_scale=time_scale, util_period_s=hpa_period))
    return out


def median(results: list[RunResult], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in results))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 seeds, time scale 5 (under a minute)")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=None, help="divide every duration by this")
    p.add_argument("--service-ms", type=float, default=1.0, help="mean service time per request per core")
    p.add_argument("--slo-ms", type=float, default=50.0, help="p99 latency SLO")
    p.add_argument("--max-replicas", type=int, default=10)
    a = p.parse_args(argv)
    seeds = a.seeds or (3 if a.quick else 7)
    ts = a.time_scale or (5.0 if a.quick else 1.0)
    if seeds < 1 or ts <= 0 or a.service_ms <= 0 or a.slo_ms <= 0 or a.max_replicas < 1:
        p.error("seeds, time-scale, service-ms, slo-ms and max-replicas must be positive")
    t0 = time.perf_counter()
    res = run(seeds, ts, a.service_ms, a.slo_ms, a.max_replicas)
    wall = time.perf_counter() - t0

    phases = " -> ".join(f"{r:.0f} rps x {d / ts:.0f}s" for d, r in NOMINAL_TRACE)
    print(f"S2 autoscale SIMULATION: {phases}; service {a.service_ms} ms/request/core (gamma CV 0.5), "
          f"p99 SLO {a.slo_ms} ms, start-up {STARTUP_S / ts:g}s, time scale {ts:g}, {seeds} seeds")
    print(f"{'controller':<10} {'violation_s':>12} {'replica_s':>10} {'flaps':>6} {'max_repl':>9}   (medians)")
    for name, rs in res.items():
        print(f"{name:<10} {median(rs, 'violation_s'):>12.1f} {median(rs, 'replica_s'):>10.1f} "
              f"{median(rs, 'flaps'):>6.0f} {median(rs, 'max_replicas'):>9.0f}")
    for name, rs in res.items():
        moves = ", ".join(f"{t:.0f}s:{f}->{to}" for t, f, to in rs[0].scale_events[:12])
        print(f"  {name} seed 0 scale moves: {moves}")
    v_p, v_h = median(res["planner"], "violation_s"), median(res["hpa"], "violation_s")
    r_p, r_h = median(res["planner"], "replica_s"), median(res["hpa"], "replica_s")
    ratio = v_p / v_h if v_h > 0 else (0.0 if v_p == 0 else math.inf)
    figures = {
        "benchmark": "scaling", "simulation": True, "seeds": seeds, "time_scale": ts,
        "service_ms": a.service_ms, "slo_ms": a.slo_ms,
        "planner_violation_s": v_p, "hpa_violation_s": v_h, "violation_ratio_vs_hpa": round(ratio, 4),
        "planner_replica_s": round(r_p, 1), "hpa_replica_s": round(r_h, 1),
        "replica_s_ratio_vs_hpa": round(r_p / r_h, 4) if r_h else None,
        "flaps": int(max(r.flaps for r in res["planner"])), "hpa_flaps": int(max(r.flaps for r in res["hpa"])),
        "target_met": bool(ratio <= 1 / 3 and max(r.flaps for r in res["planner"]) == 0),
        "wall_s": round(wall, 2),
    }
    print(f"violation ratio planner/hpa {ratio:.3f} (target <= 0.333), replica-seconds ratio "
          f"{figures['replica_s_ratio_vs_hpa']}, planner flaps {figures['flaps']}; {wall:.1f}s wall")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
